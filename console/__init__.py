"""The web console: `danube admin serve --mode ui` (pages, charts and actions over the admin API)."""
