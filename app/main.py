"""The Streamlit entry script: page config, the optional demo password, and navigation over the
page scripts in `pages/`. Nothing else runs here."""

from pathlib import Path

import streamlit as st

from app.guard import require_password

# A local image, served by this server: an emoji or a `:material/...:` page icon makes the browser
# fetch the favicon from a CDN or Google's font host (the app must need nothing from outside).
ICON = Path(__file__).resolve().parent / "assets" / "icon.png"

st.set_page_config(page_title="Ecdysis", page_icon=str(ICON), layout="wide")

if require_password():
    st.navigation([
        st.Page("../pages/1_runs.py", title="Runs", icon=":material/play_circle:", url_path="runs", default=True),
        st.Page("../pages/2_clusters.py", title="Failure clusters", icon=":material/bubble_chart:",
                url_path="clusters"),
        st.Page("../pages/3_diagnoses.py", title="Diagnoses", icon=":material/forum:", url_path="diagnoses"),
        st.Page("../pages/4_review.py", title="Review", icon=":material/rate_review:", url_path="review"),
        st.Page("../pages/5_evolution.py", title="Evolution", icon=":material/trending_up:", url_path="evolution"),
        st.Page("../pages/6_harnesses.py", title="Harnesses", icon=":material/account_tree:", url_path="harnesses"),
    ], position="top").run()
