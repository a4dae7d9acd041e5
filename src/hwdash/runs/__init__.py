"""A training run held against its plan: the live view (speed, MFU, time to finish, cost, energy,
planned vs measured peak), the runs ledger, and what the ledger teaches the next plan.

Layer: above the core and the telemetry (it reads plans and snapshots); below the commands and the
dashboard. The probe imports only :mod:`hwdash.runs.ledger` and :mod:`hwdash.runs.recorder`, at the
end of a run.
"""
