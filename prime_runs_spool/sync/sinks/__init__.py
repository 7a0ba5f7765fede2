"""Where a run's episodes go on a destination: each sink (samples, Prime Traces) keeps one
contract (``base``) and the pass (sync/engine.py) drives whichever ``choice`` picks.

Empty on purpose: ``registry`` is imported by the state file's model, so importing this
package must not import any sink.
"""
