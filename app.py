"""The dashboard: `streamlit run app.py` (or `make run`). Pages live in pages/; the engine in anatomy/."""


def main() -> None:
    import streamlit as st

    from pages import common

    st.set_page_config(page_title="Model training anatomy", page_icon=":material/memory:",
                       layout="wide")
    page = st.navigation([
        st.Page("pages/live.py", title="Live run", icon=":material/monitoring:", default=True),
        st.Page("pages/runs.py", title="Runs", icon=":material/table_rows:"),
        st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
        st.Page("pages/memory_anatomy.py", title="Anatomy", icon=":material/stacked_bar_chart:",
                url_path="anatomy"),
    ])
    common.sidebar_device()
    page.run()


# Streamlit runs this file as __main__. A run's sampler and worker are spawned processes, and
# spawning imports the parent's main file again (as __mp_main__): there it must do nothing, not
# even import Streamlit, or the worker's baseline would measure the dashboard instead of itself.
if __name__ == "__main__":
    main()
