"""The study: plan and run many runs, store them, compare them with statistics, report and advise.

`Study` (what to compare), `plan` (its runs), `run_study` (execute and summarise) and
`summarize_study` are the entry points; `ffnlab.study.store.Store` holds the results.
"""

from ffnlab.study.execute import run_study
from ffnlab.study.plan import Study, plan
from ffnlab.study.summary import summarize_study

__all__ = ["Study", "plan", "run_study", "summarize_study"]
