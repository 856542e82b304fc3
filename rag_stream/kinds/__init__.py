"""The kinds of stream, one folder each: what a request becomes, event by event.

A kind's folder holds its intent (the typed request its routes translate into), its plan (what a
takeover needs, saved in Redis), its producer (one run: the events it writes, then ``done``),
its kind object (``accept``, ``continuation``) and its routes. ``registry.py`` lists the kinds;
``base.py`` is what they share; ``tokens.py`` the token phase every kind ends with.
"""
