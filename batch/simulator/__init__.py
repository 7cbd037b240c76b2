"""A fleet of simulated MyData providers for the demo, the tests and the benchmarks.

``Simulator`` serves in-process (tests drive it with a FakeClock); ``SimulatorProcess``
runs ``mydata-batch simulate`` in a subprocess so it never shares the client's core.
"""

from __future__ import annotations

from batch.simulator.app import Simulator
from batch.simulator.fleet import consent_key
from batch.simulator.process import SimulatorProcess
from batch.simulator.scenario import Behaviour, Event, Scenario, load_scenario, parse_scenario

__all__ = [
    "Behaviour",
    "Event",
    "Scenario",
    "Simulator",
    "SimulatorProcess",
    "consent_key",
    "load_scenario",
    "parse_scenario",
]
