"""flow/op_kinds.py: the kinds of op that let a build configuration's checks run one op of each kind. Every declared
op's traits are on a known path (the guard: an op of an uncovered kind fails here, by name), the representatives
together have every trait of every op, and an op with a trait no other has becomes a representative itself."""

import dataclasses

import pytest

from flow import op_kinds


@pytest.fixture(scope="module")
def schemas(declared, aot_ops, python_ops):
    return op_kinds.registered_schemas(declared)


def test_every_declared_op_is_of_a_covered_kind(declared, schemas):
    assert [p for name, op in declared.items() for p in op_kinds.uncovered(op, schemas[name], declared)] == []


def test_the_representatives_have_every_trait_of_every_op(declared, schemas):
    chosen = op_kinds.representatives(declared, schemas)
    have = set().union(*(op_kinds.traits(op, schemas[op.name], declared) for op in chosen))
    for name, op in declared.items():
        assert op_kinds.traits(op, schemas[name], declared) <= have, name
    assert len(chosen) < len(declared)


def test_the_traits_read_from_schemas(declared, schemas):
    def traits(name):
        return op_kinds.traits(declared[name], schemas[name], declared)

    assert "several outputs" in traits("my_ops::quantize_rows") and "several outputs" not in traits("my_ops::mul3")
    assert "an input written in place" in traits("my_ops::update_cache")
    assert "an input written in place" not in traits("my_ops::rms_norm")
    assert {"argument Tensor", "argument float"} <= traits("my_ops::rms_norm")
    assert "kernel sources shared with another op" in traits("my_ops::linear_blocks")
    assert "kernel sources shared with another op" not in traits("my_ops::mul4")


def test_an_op_of_an_uncovered_kind_is_named(declared, schemas):
    mul4 = declared["my_ops::mul4"]
    plugin = dataclasses.replace(mul4, runtime_registration="a_plugin")
    (problem,) = op_kinds.uncovered(plugin, schemas["my_ops::mul4"], declared)
    assert "my_ops::mul4: trait 'registered from cpp, in the runtime by a_plugin' is on no path" in problem

    @dataclasses.dataclass(frozen=True)
    class WithVulkan(type(mul4)):
        vulkan_sources: tuple[str, ...] = ()

    (problem,) = op_kinds.uncovered(WithVulkan(**dataclasses.asdict(mul4)), schemas["my_ops::mul4"], declared)
    assert "declaration field 'vulkan_sources' is neither a trait nor listed as no path" in problem


def test_an_op_with_a_trait_no_other_has_is_a_representative(declared, schemas):
    # A copy of mul4 taking a bool: no declared op has one, so it joins the representatives.
    flagged = dataclasses.replace(declared["my_ops::mul4"], name="my_ops::mul4_flagged")
    with_it = {**declared, flagged.name: flagged}
    schema = schemas["my_ops::mul4"].replace("(Tensor input,", "(Tensor input, bool flag,")
    chosen = op_kinds.representatives(with_it, {**schemas, flagged.name: schema})
    assert flagged in chosen and op_kinds.uncovered(flagged, schema, with_it) == []
