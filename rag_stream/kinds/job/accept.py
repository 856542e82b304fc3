"""A job request checked against the ``jobs.*`` settings and the model's window: 422s that
name the field and the setting, before anything is stored or started."""

from __future__ import annotations

from rag_stream.errors import InvalidRequest
from rag_stream.generation.engine import Engine
from rag_stream.kinds.job.prompt import check_fits
from rag_stream.schemas.jobs import JobRequest, JobSpec
from rag_stream.settings import JobsSettings


def _bounded(name: str, value: int, low: int, high: int, setting: str) -> int:
    if not low <= value <= high:
        raise InvalidRequest(
            f"{name} must be between {low} and {high} ({setting}), got {value}", param=name
        )
    return value


def check_request(engine: Engine, cfg: JobsSettings, body: JobRequest) -> JobSpec:
    if len(body.title) > cfg.max_title_chars:
        raise InvalidRequest(
            f"title is {len(body.title)} characters; the limit is {cfg.max_title_chars} "
            "(jobs.max_title_chars)",
            param="title",
        )
    instructions = (body.instructions or "").strip() or None
    if instructions is not None and len(instructions) > cfg.max_instructions_chars:
        raise InvalidRequest(
            f"instructions are {len(instructions)} characters; the limit is "
            f"{cfg.max_instructions_chars} (jobs.max_instructions_chars)",
            param="instructions",
        )
    outline = body.outline
    if outline is not None:
        _bounded("outline", len(outline), 1, cfg.max_sections, "jobs.max_sections")
        for i, heading in enumerate(outline):
            if len(heading) > cfg.max_heading_chars:
                raise InvalidRequest(
                    f"outline heading {i} is {len(heading)} characters; the limit is "
                    f"{cfg.max_heading_chars} (jobs.max_heading_chars)",
                    param="outline",
                )
        if body.sections is not None and body.sections != len(outline):
            raise InvalidRequest(
                f"sections ({body.sections}) differs from the outline's {len(outline)} "
                "headings; send one or the other",
                param="sections",
            )
        sections = len(outline)
    elif body.sections is None:
        raise InvalidRequest("send an outline (headings) or a number of sections to plan")
    else:
        sections = _bounded("sections", body.sections, 1, cfg.max_sections, "jobs.max_sections")
    section_tokens = _bounded(
        "section_tokens",
        cfg.default_section_tokens if body.section_tokens is None else body.section_tokens,
        1,
        cfg.max_section_tokens,
        "jobs.max_section_tokens",
    )
    top_k = _bounded(
        "top_k",
        cfg.default_top_k if body.top_k is None else body.top_k,
        0,
        cfg.max_top_k,
        "jobs.max_top_k",
    )
    spec = JobSpec(
        title=body.title,
        instructions=instructions,
        outline=outline,
        sections=sections,
        section_tokens=section_tokens,
        top_k=top_k,
        mode=body.mode,
        temperature=body.temperature,
        seed=body.seed,
    )
    check_fits(engine, spec, outline)
    return spec
