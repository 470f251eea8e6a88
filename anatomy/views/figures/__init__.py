"""Plotly figures, one module per page (`live`: a run's charts, drawn on the Live and Runs pages
and in an export; `runs`, `compare`, `anatomy`), built from store rows and `RunReport`s: no
Streamlit, no browser. The pages only pass them on, to be drawn as an SVG picture of the figure
(`svg`: a new tab's charts, without Plotly's script) or as the interactive chart; the tests read
them as plain objects. `layout` holds what several of them draw alike."""
