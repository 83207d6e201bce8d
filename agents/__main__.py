"""`python -m agents worker -l info`: a Faust worker evaluating the rules."""

from agents.wiring import build_app

build_app().main()
