"""The web console of `danube admin serve --mode ui` (Starlette pages over the admin API)."""
