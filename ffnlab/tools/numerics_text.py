"""The text that `ffnlab numerics` prints: one plain table per section of a `run_numerics` report."""

from __future__ import annotations

import math
from typing import Any

from ffnlab.tools.accuracy import REGIONS, TAIL_NAMES


def fmt_value(v: float | str | None) -> str:
    """A value for a table cell or a claim: numbers to 3 significant digits, '-' for None."""
    if v is None:
        return "-"
    if isinstance(v, (bool, str)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def _header(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    lo, hi = report["range"]
    return [
        f"ffnlab numerics: x in [{lo:g}, {hi:g}], {report['points']} grid points rounded to each dtype; "
        "float64 reference (scipy), mpmath in the GELU tail",
        f"torch {env['torch']}, numpy {env['numpy']}, scipy {env['scipy']}, mpmath {env['mpmath']}, "
        f"Python {env['python']}, {env['machine']}, {env.get('cpu') or '?'} (torch kernels: "
        f"{env.get('isa') or '?'}), {env['torch_threads']} torch threads",
        "",
    ]


def _error_table(results: list[dict[str, Any]]) -> list[str]:
    regions = list(REGIONS)
    head = (
        f"{'name':<18} {'dtype':<5} {'pass':<8} {'max_abs':>9} {'at_x':>7} {'max_rel':>9} {'max_ulp':>9} "
        f"{'at_x':>7} | " + " ".join(f"{r:>9}" for r in regions) + f" | {'inf':>4} {'nan':>4} {'ovf':>4}"
    )
    out = [
        "Error against the reference (ulp: unit in the last place of the reference in the dtype; inf/nan/ovf: counts)",
        head,
        "-" * len(head),
    ]
    for r in results:
        out.append(
            f"{r['name']:<18} {r['dtype']:<5} {r['pass']:<8} {fmt_value(r['max_abs_err']):>9} "
            f"{fmt_value(r['argmax_x']):>7} {fmt_value(r['max_rel_err']):>9} {fmt_value(r['max_ulp']):>9} "
            f"{fmt_value(r['argmax_ulp_x']):>7} | "
            + " ".join(f"{fmt_value(r['regions'][g]['max_ulp']):>9}" for g in regions)
            + f" | {r['n_inf']:>4} {r['n_nan']:>4} {r['n_overflow']:>4}"
        )
    out.append("(columns after the first | are max_ulp per region of x)")
    notes = {r["name"]: r["note"] for r in results if r.get("note")}
    out += [f"note: {name} is {note}" for name, note in notes.items()]
    return out


def _int8_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    head = (
        f"{'name':<15} {'computes':<10} {'table B':>7} {'scale in':>9} {'scale out':>9} {'max_abs':>9} "
        f"{'at_x':>7} {'max_step':>8}  method"
    )
    out = [
        "",
        "int8 input and output (symmetric per-tensor scales calibrated on the range; every int8 code in it; "
        "max_step: error in output steps, 0.5 is correctly rounded)",
        head,
        "-" * len(head),
    ]
    for r in rows:
        out.append(
            f"{r['name']:<15} {r['reference']:<10} {r['table_bytes']:>7} {fmt_value(r['scale_in']):>9} "
            f"{fmt_value(r['scale_out']):>9} {fmt_value(r['max_abs_err']):>9} {fmt_value(r['argmax_x']):>7} "
            f"{fmt_value(r['max_ulp']):>8}  {r['method']}"
        )
    return out


def _gelu_distance_table(distances: list[dict[str, Any]]) -> list[str]:
    if not distances:
        return []
    title = "GELU approximations against exact GELU (float64 formulas; last column: fp32 implementation)"
    head = (f"{'name':<18} {'same_as':<13} {'max_abs':>9} {'at_x':>7} {'max_rel x>0':>11} {'at_x':>7} "
            f"{'grad max_abs':>12} {'fp32 max_abs':>12}")  # fmt: skip
    rows = [
        f"{d['name']:<18} {d['same_as'] or '':<13} {fmt_value(d['max_abs_err']):>9} {fmt_value(d['argmax_x']):>7} "
        f"{fmt_value(d['max_rel_err_pos']):>11} {fmt_value(d['argmax_rel_x']):>7} "
        f"{fmt_value(d['max_abs_err_grad']):>12} {fmt_value(d['max_abs_err_fp32_impl']):>12}"
        for d in distances
    ]
    return ["", title, head, *rows]


def _tail_table(tail: dict[str, Any]) -> list[str]:
    title = f"Exact GELU in the negative tail, {tail['dtype']}, x in {tail['range']}, reference {tail['reference']}"
    head = f"{'name':<12} {'pass':<8} {'max_rel':>9} {'max_ulp':>9} {'max_abs':>9} {'at_x':>7}"
    rows = [
        f"{r['name']:<12} {r['pass']:<8} {fmt_value(r['max_rel_err']):>9} {fmt_value(r['max_ulp']):>9} "
        f"{fmt_value(r['max_abs_err']):>9} {fmt_value(r['argmax_x']):>7}"
        for r in tail["rows"]
    ]
    samples = [
        f"{s['x']:>6g} {s['reference']:>11.4g} " + " ".join(f"{s[n]:>11.4g}" for n in TAIL_NAMES)
        for s in tail["samples"]
    ]
    return ["", title, head, *rows, f"{'x':>6} {'mpmath':>11} " + " ".join(f"{n:>11}" for n in TAIL_NAMES), *samples]


def _gated_table(gated: list[dict[str, Any]]) -> list[str]:
    if not gated:
        return []
    out = [
        "",
        f"Gated products act(a)*b, a, b ~ N(0, s^2), {gated[0]['n']} samples: eager (act and * in the dtype, two "
        "roundings) vs fused (fp32 inside, one rounding)",
        f"{'ffn':<7} {'dtype':<5} {'s':>6} | {'inf exact':>9} {'inf eager':>9} {'inf fused':>9} | "
        f"{'max_ulp eager':>13} {'fused':>7} | {'mean_ulp eager':>14} {'fused':>7} | "
        f"{'rounded ok eager':>16} {'fused':>7}",
    ]
    for g in gated:
        out.append(
            f"{g['ffn']:<7} {g['dtype']:<5} {g['scale']:>6g} | {fmt_value(g['frac_inf_exact']):>9} "
            f"{fmt_value(g['frac_inf_eager']):>9} {fmt_value(g['frac_inf_fused']):>9} | "
            f"{fmt_value(g['max_ulp_eager']):>13} {fmt_value(g['max_ulp_fused']):>7} | "
            f"{fmt_value(g['mean_ulp_eager']):>14} {fmt_value(g['mean_ulp_fused']):>7} | "
            f"{fmt_value(g['frac_correctly_rounded_eager']):>16} {fmt_value(g['frac_correctly_rounded_fused']):>7}"
        )
    out.append(
        "(inf: fraction of products that are inf; ulp errors at large s come from tiny products of very "
        "negative a, which fp32 silu/gelu flush to 0)"
    )
    return out


def _claims_list(claims: list[dict[str, Any]]) -> list[str]:
    if not claims:
        return []
    out = ["", "Claims from articles, measured here"]
    for c in claims:
        out.append(f"{c['id']}. {c['claim']}  [{c['source']}]")
        out.append(f"   claimed: {c['claimed']}")
        out.append(f"   measured: {c['measured']}")
        # a claim whose words read more than one way gets a verdict per reading
        readings = "; ".join(f"{v.upper()} for {reading}" for reading, v in c.get("readings", {}).items())
        out.append(f"   -> {readings or c['verdict'].upper()}" + (f"  ({c['note']})" if c["note"] else ""))
    return out


def format_numerics(report: dict[str, Any]) -> str:
    """Readable tables of a `run_numerics` report: errors, GELU approximations, tail, gated products, claims."""
    return "\n".join(
        _header(report)
        + (_error_table(report["results"]) if report["results"] else [])
        + _int8_table(report.get("int8", []))
        + _gelu_distance_table(report["gelu_distance"])
        + _tail_table(report["tail"])
        + _gated_table(report["gated"])
        + _claims_list(report["claims"])
    )
