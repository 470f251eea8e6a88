"""The dashboard: `streamlit run app.py` (or `make run`). Pages live in pages/, what they share
(the navigation among them) in dashboard/, the engine in anatomy/."""


def main() -> None:
    from dashboard import common

    common.run_app()


# Streamlit runs this file as __main__. A run's sampler and worker are spawned processes, and
# spawning imports the parent's main file again (as __mp_main__): there it must do nothing, not
# even import Streamlit, or the worker's baseline would measure the dashboard instead of itself.
if __name__ == "__main__":
    main()
