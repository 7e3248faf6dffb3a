"""Parsed events to one frozen record per request. ``assembler`` dispatches each event to its
parts: the server's clock and epochs (``logclock``), the process (``serverstate``), the RAM-cache
lines of a selection (``promptcache``) and the cache they describe (``cachemirror``), which
request and conversation a task was (``join``, ``attribution``), prefills over time
(``timeline``), LoRA lists (``lora``); ``finish`` waits until a released task can be judged and
``classify`` judges it. ``router`` names a router's children."""
