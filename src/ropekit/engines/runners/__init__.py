"""Standalone scripts that run a model in one engine and write per-token log-probabilities as JSON.

Each runs under the engine's own Python (its virtual environment, see ``ropekit engines install``) and imports
neither ropekit nor anything the engine's environment lacks. Protocol: ``python RUNNER REQUEST.json
RESPONSE.json``; the request names the model, the token ids (a list of sequences), the context size, CPU threads
and an optional greedy generation; the response holds, per sequence, ``[null, lp_1, …]`` (the log-probability of
token t given the tokens before it), the generated ids when asked, the engine's name and version, and seconds.
"""
