"""The web console: server-rendered pages over the admin service, on the admin port.

``routes`` parses forms and renders ``templates/`` with what ``api.service.AdminService``
answers (the admin API is one client of that service, the console another); ``session``
signs the login cookie and derives each session's CSRF token; ``guard`` is the ASGI
middleware that sends the security headers and turns away requests without a session;
``stats`` keeps the request counters' history for the hour and day windows; ``timeline``
turns an activation into one bar per phase. Every asset is in ``static/``.
"""
