"""The web UI: the router (pages, login), one module per area of htmx routes, and the rendering they share."""
