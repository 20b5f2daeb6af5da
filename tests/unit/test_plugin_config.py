"""Each plug-in's config (recipes/config/plugins.py, named by its record): a key two plug-ins read is declared once;
reading a key the chosen plug-in does not read is an error; choosing another plug-in in code keeps the keys the two
read, at every seam of base/registry.py SEAMS."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import typing
from dataclasses import dataclass

import pytest

from base import registry
from recipes.config import Config
from recipes.config.fields import _f, _plain, domain_rule
from recipes.config.schema import default_of, knob_fields

SEAMS = list(registry.SEAMS)


@pytest.fixture
def fresh_knobs():
    """knob_fields is cached per seam: a test that registers a record sees its own table, and leaves none behind."""
    knob_fields.cache_clear()
    yield
    knob_fields.cache_clear()


@pytest.mark.parametrize("seam", SEAMS)
def test_every_key_of_a_seam_is_declared_by_one_class(seam):
    """Two records reading one key inherit its one declaration: the same field wherever it is read."""
    declared: dict[str, dataclasses.Field] = {}
    for record in registry.SEAMS[seam].records.values():
        if not record.config:
            continue
        for f in dataclasses.fields(registry.resolve(record.config)):
            assert declared.setdefault(f.name, f) is f, f"{seam}.{f.name}: declared twice"
    assert set(declared) == set(knob_fields(seam))


def test_a_second_declaration_with_another_domain_is_refused(monkeypatch, fresh_knobs):
    """An optimizer re-declaring AdamW's betas with a narrower domain would be validated against AdamW's (0.99 loaded
    under [0, 0.95)): knob_fields refuses the second declaration, naming both classes and how they differ."""

    @dataclass
    class NarrowBetas:
        betas: list[float] = _f(help="betas", factory=lambda: [0.9, 0.9], domain="nonempty [0,1) <=0.95")

    monkeypatch.setattr(registry, "_narrow_betas", NarrowBetas, raising=False)
    record = registry.Optimizer("made_up_adam", "recipes.optim:build_adamw", "base.registry:_narrow_betas")
    monkeypatch.setitem(registry.OPTIMIZERS, "made_up_adam", record)
    with pytest.raises(TypeError) as e:
        knob_fields("optim")
    assert str(e.value) == (
        "optim.betas: declared by AdamWConfig (a list of a number, default [0.9, 0.999], domain 'nonempty [0,1)') "
        "and again by test_a_second_declaration_with_another_domain_is_refused.<locals>.NarrowBetas (a list of a "
        "number, default [0.9, 0.9], domain 'nonempty [0,1) <=0.95'): declare it once, in a class both inherit"
    )


def test_a_plugin_key_that_is_also_a_section_key_is_refused(monkeypatch, fresh_knobs):
    @dataclass
    class OwnLr:
        lr: float = _f(0.5, help="lr", domain=">=0")

    monkeypatch.setattr(registry, "_own_lr", OwnLr, raising=False)
    monkeypatch.setitem(
        registry.OPTIMIZERS, "made_up_lr", registry.Optimizer("made_up_lr", "x:y", "base.registry:_own_lr")
    )
    with pytest.raises(TypeError, match=r"^optim.lr: declared by the section and again by .*OwnLr$"):
        knob_fields("optim")


def _records(seam):
    return list(registry.SEAMS[seam].records.values())


@pytest.mark.parametrize("seam", SEAMS)
def test_reading_a_key_the_chosen_plugin_does_not_read_is_an_error(seam):
    """Not another plug-in's default: an AttributeError that names the key, the chosen plug-in and its readers;
    `get` says where a reader may run under any plug-in, and `as_part` reads it as that plug-in would."""
    s = registry.SEAMS[seam]
    cases = [(r, k) for r in s.records.values() for k in knob_fields(seam) if k not in r.reads]
    for record, key in cases:
        section = getattr(Config(), seam)
        setattr(section, s.key, record.name)
        readers = [r.name for r in s.records.values() if key in r.reads]
        with pytest.raises(AttributeError) as e:
            getattr(section, key)
        assert str(e.value).startswith(
            f"{seam}.{key}: not a key of {seam}.{s.key}={record.name} (read by {', '.join(readers)}); "
        )
        assert section.get(key, "absent") == "absent"
        assert getattr(section.as_part(readers[0]), key) == default_of(knob_fields(seam)[key][0])
    with pytest.raises(AttributeError, match="has no key 'no_such_key'"):
        getattr(Config(), seam).get("no_such_key")


def _other_value(key: str, f: dataclasses.Field, tp) -> object:
    """A value of the key's type and domain other than its default (each seam's keys are bools, choices, numbers,
    lists and names)."""
    d = default_of(f)
    plain = _plain(tp)
    ok = [domain_rule(w)[0] for w in f.metadata.get("domain", "").split() if w != "nonempty"]
    if plain is bool or tp == bool | typing.Literal["auto"]:
        return not d if isinstance(d, bool) else False
    if typing.get_origin(plain) is typing.Literal:
        return next(a for a in typing.get_args(plain) if a != d)
    if typing.get_origin(plain) is list:
        return list(d[:1]) if len(d) > 1 else [*d, *d]
    if typing.get_origin(plain) is dict:
        return {"named": "elsewhere"}
    if plain is str:
        return (d or "x") + "2"
    if d is None:  # a number that may be unset
        d = 1 if plain is int else 0.5
        return d if all(t(d) for t in ok) else pytest.fail(f"{key}: no value for its domain")
    for v in (d + 1, d * 0.5, d - 1) if plain is int else (d * 0.5, d * 2, 0.5):
        v = int(v) if plain is int else v
        if v != d and all(t(v) for t in ok):
            return v
    raise AssertionError(f"{key}: no other value in its domain")


PAIRS = [
    (seam, a.name, b.name)
    for seam in SEAMS
    for a, b in itertools.permutations(_records(seam), 2)
    if set(a.reads) & set(b.reads)
]


@pytest.mark.parametrize(("seam", "first", "then"), PAIRS, ids=lambda v: v)
def test_choosing_another_plugin_in_code_keeps_the_keys_the_two_read(seam, first, then):
    """`cfg.optim.name = "lars"` after `momentum` and `nesterov` were set under sgd: lars reads them as set. Its own
    other keys start at their defaults; the first one's keys it does not read wait (inert) until it is chosen again."""
    s = registry.SEAMS[seam]
    a, b = s.records[first], s.records[then]
    fields = knob_fields(seam)
    given = {k: _other_value(k, *fields[k]) for k in a.reads}
    section = getattr(Config(), seam)
    setattr(section, s.key, first)
    for k, v in given.items():
        setattr(section, k, copy.deepcopy(v))
    setattr(section, s.key, then)
    assert {k: getattr(section, k) for k in b.reads} == {
        k: given[k] if k in a.reads else default_of(fields[k][0]) for k in b.reads
    }
    assert section.unread == {k: v for k, v in given.items() if k not in b.reads}
    setattr(section, s.key, first)  # and back: what the first one was given, whatever the second reads
    assert {k: getattr(section, k) for k in a.reads} == given
    assert section.unread == {}


def test_every_seam_has_a_pair_that_shares_keys():
    """The switching test above covers each seam: every seam with two plug-ins has a pair that shares a key."""
    covered = {seam for seam, _, _ in PAIRS}
    assert covered == {seam for seam in SEAMS if len(_records(seam)) > 1}
