"""Choose which slots of which hosts a job uses (DeepSpeed's ``-i/-e/--num_nodes/--num_gpus``).

``NODE_SPEC[@NODE_SPEC ...]`` with ``NODE_SPEC = NAME[:SLOT[,SLOT ...]]``: a name alone means all of
that host's slots; repeated slots are harmless. ``--include`` starts from nothing and adds,
``--exclude`` starts from everything and removes (a host left with no slot is dropped). The result
keeps the hostfile's host order and sorted slot ids, so ranks are numbered host by host in plan
order. A host's slots are ``0 .. slots-1`` (its accelerator ids where it has accelerators).
"""

from __future__ import annotations


class ResourceError(ValueError):
    """An impossible or contradictory resource selection; the message names the culprit."""


def _parse_spec(spec: str, flag: str, hosts: dict[str, int]) -> dict[str, list[int] | None]:
    """``{host: [slots] or None (= all)}`` in the order the spec names them."""
    out: dict[str, list[int] | None] = {}
    if not spec or not spec.strip():
        raise ResourceError(f"{flag}: empty host list")
    for part in spec.split("@"):
        part = part.strip()
        if not part:
            raise ResourceError(f"{flag} {spec!r}: empty NODE_SPEC (stray '@')")
        name, sep, slot_text = part.partition(":")
        name = name.strip()
        if name not in hosts:
            known = ", ".join(hosts) or "none"
            raise ResourceError(f"{flag}: unknown host {name!r} (hosts: {known})")
        if not sep:
            out[name] = None
            continue
        slots: list[int] = []
        for tok in slot_text.split(","):
            tok = tok.strip()
            try:
                slot = int(tok, 10)
            except ValueError:
                raise ResourceError(f"{flag}: slot {tok!r} of host {name!r} is not an integer") from None
            if not 0 <= slot < hosts[name]:
                raise ResourceError(f"{flag}: host {name!r} has no slot {slot} "
                                    f"(it has slots 0-{hosts[name] - 1})")
            slots.append(slot)
        if name in out and out[name] is None:
            continue  # already "all slots"
        out[name] = sorted(set(out.get(name) or []) | set(slots))
    return out


def _positive(value, flag: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ResourceError(f"{flag} must be a positive integer, got {value!r}") from None
    if n <= 0:
        raise ResourceError(f"{flag} must be a positive integer, got {n}")
    return n


def select_resources(hosts: dict[str, int], include: str | None = None, exclude: str | None = None,
                     num_nodes: int | None = None,
                     nproc_per_node: int | None = None) -> dict[str, list[int]]:
    """Return ``{host: [slot ids]}`` in hostfile order; raises ResourceError."""
    if not hosts:
        raise ResourceError("no hosts to choose from")
    if include and exclude:
        raise ResourceError("--include and --exclude cannot be used together")
    if (include or exclude) and (num_nodes is not None or nproc_per_node is not None):
        which = "--num-nodes" if num_nodes is not None else "--nproc-per-node"
        flag = "--include" if include else "--exclude"
        raise ResourceError(f"{which} cannot be used together with {flag} (the spec already names the slots)")

    if include:
        spec = _parse_spec(include, "--include", hosts)
        chosen = {h: (list(range(hosts[h])) if spec[h] is None else spec[h]) for h in hosts if h in spec}
    elif exclude:
        spec = _parse_spec(exclude, "--exclude", hosts)
        chosen = {}
        for h, n in hosts.items():
            drop = spec.get(h, [])
            if drop is None:
                continue
            keep = [s for s in range(n) if s not in set(drop)]
            if keep:
                chosen[h] = keep
        if not chosen:
            raise ResourceError(f"--exclude {exclude!r} leaves no slot to run on")
    else:
        chosen = {h: list(range(n)) for h, n in hosts.items()}
        if num_nodes is not None:
            n = _positive(num_nodes, "--num-nodes")
            if n > len(chosen):
                raise ResourceError(f"--num-nodes {n} but only {len(chosen)} host(s) are available "
                                    f"({', '.join(chosen)})")
            chosen = dict(list(chosen.items())[:n])
        if nproc_per_node is not None:
            n = _positive(nproc_per_node, "--nproc-per-node")
            short = [h for h in chosen if hosts[h] < n]
            if short:
                h = short[0]
                raise ResourceError(f"--nproc-per-node {n} but host {h!r} has only {hosts[h]} slot(s)")
            chosen = {h: s[:n] for h, s in chosen.items()}
    return chosen


def select_with_spares(hosts: dict[str, int], spares: set, include: str | None = None,
                       exclude: str | None = None, num_nodes: int | None = None,
                       nproc_per_node: int | None = None) -> tuple:
    """``(selection, spare selection)``: the hostfile's ``spare`` hosts are kept out of the first
    plan. ``--include/--exclude`` apply to spares too (a spare left out is no spare);
    ``--num-nodes`` counts only the others; ``--nproc-per-node`` applies to both."""
    if not spares:
        return select_resources(hosts, include, exclude, num_nodes, nproc_per_node), {}
    if include or exclude:
        chosen = select_resources(hosts, include, exclude, num_nodes, nproc_per_node)
        main = {h: s for h, s in chosen.items() if h not in spares}
        if not main:
            raise ResourceError(f"{'--include' if include else '--exclude'} leaves only spare "
                                f"hosts ({', '.join(chosen)}); a job needs a host not marked spare")
        return main, {h: s for h, s in chosen.items() if h in spares}
    main = select_resources({h: n for h, n in hosts.items() if h not in spares},
                            num_nodes=num_nodes, nproc_per_node=nproc_per_node)
    try:
        extra = select_resources({h: n for h, n in hosts.items() if h in spares},
                                 nproc_per_node=nproc_per_node)
    except ResourceError as exc:
        raise ResourceError(f"spare host: {exc}") from None
    return main, extra
