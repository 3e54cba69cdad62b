"""Who is calling: bearer tokens per tenant (:mod:`.tokens`) and the HTTP 401 that asks for one (:mod:`.bearer`)."""
