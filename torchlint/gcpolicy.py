"""The garbage-collector policy of a run, in one place.

A parse allocates millions of libcst nodes that live until the file is done. The collector is
off inside ``engine.lint_text`` (and the model's cycles are broken there). The run's own
bookkeeping (the cache's snapshot, the project's exports, the results: JSON-like data, no
reference cycles) is not walked either: ``engine.run`` keeps the collector off, and a pool in
this process collects every ``GC_EVERY`` files. (A warm run decodes a few hundred thousand
objects from the cache; each automatic collection over them cost 12-80 ms of a 0.3 s run.)
Pool workers and the language server collect with ``WORKER_THRESHOLD`` between files.
"""

WORKER_THRESHOLD = (100_000, 50, 100)
GC_EVERY = 256
