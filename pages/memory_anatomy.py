"""Anatomy: a place for what the memory of a run is made of (a later issue fills it)."""

import streamlit as st

st.title("Anatomy")
st.info("coming: the anatomy of a run's memory (weights, gradients, optimizer states, "
        "activations, temporary buffers) and of its operations")
