"""The Streamlit face of Ecdysis: `main.py` (page config + navigation) and the shared UI pieces the
thin scripts in `pages/` are made of. Everything here talks to the engine through `Service` only."""
