"""The processes of a job: topology and launcher variables, the process group, collectives with
timeouts, the hang watchdog, ports, job ids and the entry-point error handler."""
