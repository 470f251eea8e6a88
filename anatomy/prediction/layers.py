"""A transformer's layers repeat: a run's recording at any depth from one recording at a small
depth (DEPTH layers), its events tagged with the layer they belong to (tracing/depth.py), without
tracing the other layers. Pure Python over the recording. A "layer" here is a block of the
model's layers (blocks.py): one layer where they are all alike, a period of them where they
repeat in a pattern (a full-attention layer every sixth), the first and the last block as
they come.

Layer TEMPLATE (the second) stands for every layer added: wherever its events run — its
weights, its forward pass, its backward pass, its share of each optimizer loop — one copy per
added layer runs beside them, after them where the layers run in order (the forward pass,
the optimizer's loops), before them where they run in reverse (the backward pass). A free names
what it frees by the layer, relative to its own (the same, the one before, the one after), and
the place among that layer's storages: a copy frees its neighbour copies' storages at the same
places. What the layers after the template free of it, they free of the last copy.

This holds only where the layers repeat: the template and the layer after it must make the same
events, freeing the same places of their neighbours (checked here; the model's layers being the
same is checked on the built model, prediction/memory.py). `extrapolate` raises DepthError
otherwise, and the caller traces in full. The tests hold the extrapolation to a full trace,
event for event, for several architectures.
"""

from __future__ import annotations

from dataclasses import replace

from anatomy.analysis import models
from anatomy.prediction.replay import ALLOC, FREE, MARK, Recording

DEPTH = 4  # the blocks traced: the first, the template, one like it, and the last
TEMPLATE = 1


def depth_of(config: dict) -> int | None:
    """The depth the config gives every stack of its layers; None without one, or where its
    stacks differ in depth."""
    depths = {config[k] for k in models.LAYER_KEYS
              if isinstance(config.get(k), int) and not isinstance(config.get(k), bool)}
    return depths.pop() if len(depths) == 1 else None


class DepthError(ValueError):
    """The recording's layers do not repeat: no extrapolation."""


class _Layers:
    """The recording's storages by layer, and each tagged event's place among them."""

    def __init__(self, recording: Recording):
        if len(recording.tags) != len(recording.events) or recording.depth != DEPTH:
            raise DepthError("the recording does not follow its layers")
        self.recording = recording
        tags = recording.tags
        self.objects: dict[tuple, list[int]] = {}  # layer -> its storages' tids, in order
        self.where: dict[int, tuple] = {}  # tid -> (layer, place)
        for i, (kind, tid, _) in enumerate(recording.events):
            if kind == ALLOC and tags[i] is not None:
                self._add(tags[i], tid)
        tid_tags = {tid: tags[i] for i, (kind, tid, _) in enumerate(recording.events)
                    if kind == ALLOC}
        # a later step's gradients, made outside the events: the layer of the first step's
        for i, tid in sorted(recording.grads_later.items()):
            tag = tid_tags.get(recording.grads_first.get(i))
            if tag is not None:
                self._add(("adopted", tag), tid)
        self.adopted = set(recording.grads_later.values())
        self.bursts = _bursts(recording)
        self.tags = _effective(recording, self.bursts)
        self.in_parts = {recording.events[i][1] for start, end in recording.segments.values()
                         for i in range(start, end) if recording.events[i][0] == ALLOC}

    def _add(self, layer: tuple, tid: int) -> None:
        places = self.objects.setdefault(layer, [])
        self.where[tid] = (layer, len(places))
        places.append(tid)

    def reference(self, position: int) -> tuple:
        """A free's referent relative to the free's layer: ("common", tid) for a storage of no
        layer, else (adopted, stack, layer offset, place)."""
        tag = self.tags[position]
        tid = self.recording.events[position][1]
        found = self.where.get(tid)
        if found is None:
            return ("common", tid)
        layer, place = found
        adopted = layer[0] == "adopted"
        stack, index = layer[1] if adopted else layer
        if tag is None:
            return ("untagged", adopted, stack, index, place)
        if tag[0] != stack:
            return ("other stack", tid)
        return ("layer", adopted, stack, index - tag[1], place)

    def token(self, position: int, segment: str) -> tuple:
        """The event as two repeated layers make it alike: a free of a neighbour's storage
        without its place (the neighbours differ: the first and the last layer)."""
        kind, _, value = self.recording.events[position]
        if kind == FREE:
            reference = self.reference(position)
            if reference[0] == "layer" and reference[3] != 0:
                reference = reference[:4]
            return segment, kind, reference
        return segment, kind, value


def _bursts(recording: Recording) -> dict[int, int]:
    """Frees in a row that free three or more layers' storages (what a forward pass kept until
    its end, a list of per-parameter tensors, let go in the order of a container; two layers'
    are a loop's last temporaries let go as it takes up the next layer): start -> end. The
    allocator ends in the same state whatever their order, so they are compared, and laid out,
    as a set."""
    out, events, tags = {}, recording.events, recording.tags
    i = 0
    while i < len(events):
        if events[i][0] != FREE:
            i += 1
            continue
        end = i
        while end < len(events) and events[end][0] == FREE:
            end += 1
        if len({tags[j] for j in range(i, end)} - {None}) > 2:
            out[i] = end
        i = end
    return out


def _effective(recording: Recording, bursts: dict[int, int]) -> list:
    """Each event's layer as its place says: a free no layer's pass made (a loop letting go of
    the last parameter's temporaries as it takes up the next) belongs where it falls, with the
    event before it; the rest as tagged."""
    tags = list(recording.tags)
    in_burst = {i for start, end in bursts.items() for i in range(start, end)}
    for start, end in recording.segments.values():
        for i in range(start + 1, end):
            if i in recording.loose and i not in in_burst:
                tags[i] = tags[i - 1]
    return tags


def _segment_of(recording: Recording) -> list[str | None]:
    out: list[str | None] = [None] * len(recording.events)
    for name, (start, end) in recording.segments.items():
        for i in range(start, end):
            out[i] = name
    return out


def _check(layers: _Layers, segment_of: list[str | None]) -> dict[int, int]:
    """That the template and the layer after it make the same events (else DepthError); for
    each of the template's events, the event of the layer after it that matches it."""
    recording = layers.recording
    # frees in a row leave the allocator as they find it in any order: compared as a set
    in_run: dict[int, int] = {}
    i = 0
    while i < len(recording.events):
        end = i
        while end < len(recording.events) and recording.events[end][0] == FREE:
            end += 1
        for j in range(i, end):
            in_run[j] = i
        i = max(end, i + 1)
    twin: dict[int, int] = {}
    for stack in sorted({t[0] for t in layers.tags if t is not None}):
        lists = []
        for index in (TEMPLATE, TEMPLATE + 1):
            positions = [i for i, t in enumerate(layers.tags)
                         if t == (stack, index) and segment_of[i] is not None]
            positions.sort(key=lambda i: (in_run.get(i, i), repr(layers.token(
                i, segment_of[i])) if i in in_run else ""))
            lists.append(positions)
        # A storage of no layer that a block frees is its last use there: the blocks after it
        # in their order use it no more (the full-attention mask, which the first layer, a
        # sliding one, does not use, goes with the template's backward pass); freed once
        # (`extrapolate`), not one block's event
        mine, next_ = ([i for i in positions if not _frees_common(layers, i)]
                       for positions in lists)
        if [layers.token(i, segment_of[i]) for i in mine] != \
                [layers.token(i, segment_of[i]) for i in next_]:
            raise DepthError("a layer makes other events than the next one")
        for kind in ((stack, TEMPLATE), ("adopted", (stack, TEMPLATE))):
            following = (stack, TEMPLATE + 1) if kind[0] != "adopted" else \
                ("adopted", (stack, TEMPLATE + 1))
            sizes = [_size(recording, t) for t in layers.objects.get(kind, [])]
            if sizes != [_size(recording, t) for t in layers.objects.get(following, [])]:
                raise DepthError("a layer holds other storages than the next one")
        twin.update(zip(mine, next_))
    return twin


def _frees_common(layers: _Layers, position: int) -> bool:
    return layers.recording.events[position][0] == FREE and \
        layers.reference(position)[0] == "common"


def _size(recording: Recording, tid: int) -> int | None:
    return next((v for k, t, v in recording.events if k == ALLOC and t == tid), None)


def extrapolate(recording: Recording, layers: int) -> Recording:
    """The same run's recording with `layers` layers in each stack (>= DEPTH), from one traced
    at DEPTH with its layers followed."""
    extra = layers - DEPTH
    if extra < 0:
        raise ValueError(f"extrapolate to {DEPTH} layers or more, not {layers}")
    known = _Layers(recording)
    segment_of = _segment_of(recording)
    bursts = known.bursts
    twin = _check(known, segment_of)
    tags = known.tags
    new: dict[tuple, int] = {}
    alive: set[int] = set()
    events: list[tuple] = []
    count = [0]

    def tid_for(key: tuple, allocate: bool = False) -> int:
        if allocate or key not in new:
            count[0] += 1
            new[key] = count[0]
        return new[key]

    def key_of(tid: int, copy: int = 0) -> tuple:
        return ("copy", tid, copy) if copy or _is_template(known, tid) else ("orig", tid)

    def resolve(position: int, copy: int) -> tuple[bool, tuple]:
        """What the free at `position` frees in copy `copy` of its layer (copy 0: the layer
        itself): (a later step's gradient?, the storage's key)."""
        reference = known.reference(position)
        tag = tags[position]
        tid = recording.events[position][1]
        adopted = tid in known.adopted
        if tag is None or tag[1] != TEMPLATE:  # another layer, or none: what it freed, the
            if reference[0] == "untagged" and reference[3] == TEMPLATE:  # template's copy
                raise DepthError("a free outside the layers frees a repeated layer's storage")
            side = extra if tag is not None and tag[1] > TEMPLATE else 0  # beside it
            return adopted, key_of(tid, side if _is_template(known, tid) else 0)
        if reference[0] == "common":  # freed once, by the copy that runs last (`emit`)
            return adopted, key_of(tid)
        if reference[0] != "layer":
            if copy:
                raise DepthError("a layer frees a storage of no layer, or of another stack")
            return adopted, key_of(tid)
        _, adopted, stack, offset, place = reference
        template = known.objects.get(("adopted", (stack, TEMPLATE)) if adopted else
                                     (stack, TEMPLATE), [])
        if offset == 0:
            return adopted, key_of(template[place], copy)
        if offset == -1:  # the layer before: for a copy, the copy before, at the place the
            if copy == 0:  # layer after the template frees of the template
                return adopted, key_of(tid)
            _, _, _, _, place = known.reference(twin[position])
            return adopted, key_of(template[place], copy - 1)
        if offset == 1:  # the layer after: for all but the last copy, the next copy
            if copy == extra:
                return adopted, key_of(tid)
            return adopted, key_of(template[place], copy + 1)
        raise DepthError("a layer frees a storage of a layer not beside it")

    def emit(position: int, copy: int, last: int = 0) -> None:
        """The event at `position` in copy `copy` of its layer; `last`: the copy that runs last
        (the template's free of a storage of no layer, its last use, is made there alone)."""
        kind, tid, value = recording.events[position]
        if kind == FREE and copy != last and tags[position] is not None and \
                tags[position][1] == TEMPLATE and _frees_common(known, position):
            return
        if kind == MARK:
            events.append((MARK, 0, value))
        elif kind == ALLOC:
            made = tid_for(key_of(tid, copy), allocate=True)
            alive.add(made)
            growth = recording.growth.get(position, 0)
            # A size that does not grow with the depth stays the object it is: a reduction's
            # staging size (reductions.Staged) keeps the layout it is made again from when a
            # batch size is made linear from two recordings (memory._linear_recording).
            events.append((ALLOC, made, value + extra * growth if growth else value))
        else:
            adopted, key = resolve(position, copy)
            if adopted:
                events.append((FREE, tid_for(("adopted", key)), 0))
            elif key[1] not in known.in_parts:  # made between the parts: the replay frees none
                events.append((FREE, tid_for(("outside", key)), 0))
            else:
                target = new.get(key)
                if target is None or target not in alive:
                    raise DepthError("a free before its allocation, or twice")
                alive.discard(target)
                events.append((FREE, target, 0))

    segments: dict[str, tuple[int, int]] = {}
    for name, (start, end) in recording.segments.items():
        begin = len(events)
        position = start
        while position < end:
            if position in bursts:  # each of the template's frees once per copy, beside it
                for at in range(position, bursts[position]):
                    copies = extra + 1 if tags[at] is not None and tags[at][1] == TEMPLATE \
                        else 1
                    for copy in range(copies):
                        emit(at, copy)
                position = bursts[position]
                continue
            tag = tags[position]
            if tag is None or tag[1] != TEMPLATE:
                emit(position, 0)
                position += 1
                continue
            stretch_end = position
            while stretch_end < end and tags[stretch_end] == tag:
                stretch_end += 1
            order = range(extra + 1) if _in_order(tags, position, stretch_end, start, end) \
                else range(extra, -1, -1)
            for copy in order:
                for at in range(position, stretch_end):
                    emit(at, copy, order[-1])
            position = stretch_end
        segments[name] = (begin, len(events))
    return _extrapolated(recording, known, events, segments, new, extra, count[0])


def _is_template(known: _Layers, tid: int) -> bool:
    found = known.where.get(tid)
    if found is None:
        return False
    layer = found[0][1] if found[0][0] == "adopted" else found[0]
    return layer[1] == TEMPLATE


def _in_order(tags: list, start: int, end: int, low: int, high: int) -> bool:
    """Whether the layers run in order around the template's stretch [start, end): the nearest
    other layer of its stack before it is the one before (or after it, the one after)."""
    stack = tags[start][0]
    for position in range(start - 1, low - 1, -1):
        tag = tags[position]
        if tag is not None and tag[0] == stack and tag[1] != TEMPLATE:
            if tag[1] in (TEMPLATE - 1, TEMPLATE + 1):
                return tag[1] == TEMPLATE - 1
            break
    for position in range(end, high):
        tag = tags[position]
        if tag is not None and tag[0] == stack and tag[1] != TEMPLATE:
            if tag[1] in (TEMPLATE - 1, TEMPLATE + 1):
                return tag[1] == TEMPLATE + 1
            break
    raise DepthError("a layer's events with no neighbouring layer to order them by")


def _extrapolated(recording: Recording, known: _Layers, events: list[tuple],
                  segments: dict[str, tuple[int, int]], new: dict[tuple, int], extra: int,
                  count: int) -> Recording:
    def copies(tid: int) -> list[tuple]:
        if _is_template(known, tid):
            return [("copy", tid, c) for c in range(extra + 1)]
        return [("orig", tid)]

    persistent = set()
    for tid in recording.persistent:
        if _is_template(known, tid):
            raise DepthError("a process-wide allocation inside a layer")
        persistent.add(new[("orig", tid)])
    batch_tids = [new[("orig", t)] for t in recording.batch_tids if ("orig", t) in new]
    grads_first, grads_later = {}, {}
    for i, tid in recording.grads_first.items():
        for c, key in enumerate(copies(tid)):
            if key not in new:
                continue
            grads_first[(i, c)] = new[key]
            later = recording.grads_later.get(i)
            if later is not None:
                adopted = ("adopted", ("copy", later, c) if key[0] == "copy" else
                           ("orig", later))
                if adopted not in new:
                    count += 1
                    new[adopted] = count
                grads_later[(i, c)] = new[adopted]
    grown = {name: getattr(recording, name) + extra * recording.per_layer.get(name, 0)
             for name in ("parameters", "trainable_parameters", "weights_bytes",
                          "gradient_bytes", "optimizer_state_bytes", "saved_bytes")}
    return replace(recording, events=events, segments=segments, persistent=persistent,
                   grads_first=grads_first, grads_later=grads_later, batch_tids=batch_tids,
                   max_tid=count + 1, tags=[], growth={}, depth=DEPTH + extra, **grown)
