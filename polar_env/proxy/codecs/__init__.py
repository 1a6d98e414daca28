"""The proxy's wire-API codecs: each API module turns a harness's request body into the canonical
request and an answer back into that API's JSON or SSE frames (the bodies' models are in
``polar_env.wire``); ``protocol.Codec`` is what each provides, ``common`` what they share."""
