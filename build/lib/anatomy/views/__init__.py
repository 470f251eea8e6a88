"""What the screens show, without Streamlit and without the engine: figures, words and page
logic, computed from reports and store rows."""
