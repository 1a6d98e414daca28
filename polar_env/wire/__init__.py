"""The bottom layer: shapes and ids of the wire APIs that the proxy's codecs answer with and the
exports (NeMo Gym results, observations) write again, so neither has to import the other. It imports
nothing of polar_env but ``chat/`` (the canonical turn) and ``fastjson``."""
