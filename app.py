"""The dashboard: `streamlit run app.py` (or `make run`). Pages live in pages/; the engine in anatomy/."""


def main() -> None:
    import streamlit as st

    from anatomy.store import StoreError
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
    try:
        common.manager()  # opens the store, and closes runs a dead server left running
    except StoreError as error:  # not a store, unreadable, read-only: one line, not a traceback
        st.error(f"The run store cannot be used: {error}. Point ANATOMY_STORE at another file.")
        st.stop()
    page.run()


# Streamlit runs this file as __main__. A run's sampler and worker are spawned processes, and
# spawning imports the parent's main file again (as __mp_main__): there it must do nothing, not
# even import Streamlit, or the worker's baseline would measure the dashboard instead of itself.
if __name__ == "__main__":
    main()
