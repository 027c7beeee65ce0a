"""Reading and writing the cache's sealed files in tests, as this user's torchlint would:
a test that damages a record and seals it again exercises the schema checks, one that
does not seal it the integrity check (``torchlint/integrity.py``)."""
import json
import os

from torchlint import integrity


def cache_root(path: str) -> str:
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(os.path.join(d, "CACHEDIR.TAG")):
        up = os.path.dirname(d)
        assert up != d, f"{path} is not in a cache"
        d = up
    return d


def name_of(path: str) -> str:
    return os.path.relpath(os.path.abspath(path), cache_root(path)).replace(os.sep, "/")


def payload(path: str) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read()
    got = integrity.unseal(integrity.load_key(), name_of(path), data)
    assert got is not None, f"{path} is not sealed with this user's key"
    return bytes(got)


def load(path: str):
    return json.loads(payload(path))


def dump(path: str, obj, seal: bool = True, name: str = None) -> None:
    """Write ``obj`` (a JSON value, or the payload's bytes) to the cache file ``path``, sealed
    for its own name (or ``name``) unless ``seal`` is false."""
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    if seal:
        data = integrity.seal(integrity.load_key(), name or name_of(path), data)
    with open(path, "wb") as fh:
        fh.write(data)


def results_in(d) -> list:
    """The results a decoded record holds: an entry's one, a run snapshot's or its index's."""
    if "result" in d:
        return [d["result"]]
    rs = d.get("results")
    if isinstance(rs, dict):
        return list(rs.values())
    return list(rs or [])
