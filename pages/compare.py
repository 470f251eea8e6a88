"""Compare: a place for runs side by side (a later issue fills it)."""

import streamlit as st

st.title("Compare")
st.info("coming: compare runs side by side (batch size, precision, gradient checkpointing, "
        "gradient accumulation, optimizer, model)")
