"""The dashboard's pages, one file each. Streamlit runs a page's file as a script (app.py's
st.navigation); nothing imports them. They sit apart from app.py because Streamlit puts the
entry's folder first on sys.path, where a page named anatomy.py would hide the package."""
