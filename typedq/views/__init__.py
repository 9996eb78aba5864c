"""The plain structures inspection answers with, built from the broker's records: one
job (:mod:`.jobs`), a durable run (:mod:`.runs`), a schedule (:mod:`.schedules`), a
partitioned queue's counts (:mod:`.partitions`) and a page of a queue's flow-control
keys (:mod:`.flowkeys`). :class:`typedq.inspector.Inspector` reads them through a
client, and ``typedq inspect`` and the dashboard show them; nothing here draws (the
``rich`` tables are :mod:`typedq.cli.render`)."""
