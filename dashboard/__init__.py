"""What the dashboard's pages share: Streamlit glue over anatomy/ (which never imports Streamlit).

Not in pages/: Streamlit would list every file there as a page."""
