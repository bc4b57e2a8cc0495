"""Data: the loader a run hands out (``loader``), how it is built (``build``), samplers, streams
(``streaming``) and a stream's resume at another layout (``stream_resume``)."""
