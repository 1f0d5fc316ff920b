"""The admin REST API: bearer-token auth, pydantic schemas, routes over ``AdminService``."""
