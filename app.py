"""`streamlit run app.py` in a clone: the package's dashboard (anatomy/dashboard/app.py), the
same entry `anatomy dashboard` and `make run` serve, with .streamlit/config.toml's settings
(this machine only, as `anatomy dashboard` binds). Not part of the package: `pip install .`
ships anatomy/ alone, and installed users run `anatomy dashboard`."""

import runpy

from anatomy.dashboard import ENTRY

# Run, not imported: Streamlit runs this file again on every rerun, and the entry with it.
runpy.run_path(str(ENTRY), run_name="__main__")
