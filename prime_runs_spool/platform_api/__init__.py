"""The real platform's contract (docs/platform-api.md): settings and credentials
(``settings``), the typed HTTP client and its failure classification (``client``), and the
v0 wire format: sample rows, evaluation metadata, the create body and the request limit
(``v0``)."""
