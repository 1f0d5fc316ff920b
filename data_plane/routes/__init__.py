"""HTTP transport: parse requests, call the core, encode responses. No model logic here."""
