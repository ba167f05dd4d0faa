"""The operators' dashboard at ``/ui``: signed sessions, the JSON it polls, its static files."""
