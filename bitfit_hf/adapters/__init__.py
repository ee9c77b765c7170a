"""The adapter format and everything that loads one: save / load / fingerprint, ``AutoBitFitModel``,
``AdapterBank``, ``MultiTaskModel`` and ``export_merged``. Never talks to the Hub itself."""
