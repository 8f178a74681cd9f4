"""The recipe table (amp/recipes.py) and the precision names it adds."""

from __future__ import annotations

from typing import get_args

from conftest import REPO

from ampcert.aggregate import TABLE_ORDER
from ampcert.amp.precision import RECIPE_PRECISIONS, Precision, autocast_precision, base_precision
from ampcert.amp.recipes import RECIPES


def test_every_recipe_is_a_precision_and_every_precision_past_the_plain_ones_a_recipe():
    plain = ("fp32", "fp16", "bf16", "fp8", "mxfp8")
    assert set(get_args(Precision)) == set(plain) | set(RECIPES)
    assert set(RECIPE_PRECISIONS) == set(RECIPES) and set(RECIPES) <= set(TABLE_ORDER)
    assert all(name == recipe.name for name, recipe in RECIPES.items())


def test_a_recipe_computes_in_its_base_or_in_fp32_when_its_model_is_in_its_dtype():
    assert autocast_precision("bf16-true") == autocast_precision("bf16-true-sr") == "fp32"  # no autocast
    assert autocast_precision("bf16-state") == autocast_precision("bf16-reduce") == "bf16"
    assert {base_precision(name) for name in RECIPES} == {"bf16"}
    assert base_precision("fp16") == "fp16" and autocast_precision("fp8") == "bf16"


def test_what_each_recipe_changes_follows_from_its_row():
    true, sr, state, reduce = (RECIPES[n] for n in ("bf16-true", "bf16-true-sr", "bf16-state", "bf16-reduce"))
    assert not true.own_optimizer and true.weights == "bf16"  # the workload's optimizer, on bf16 weights
    assert sr.own_optimizer and state.own_optimizer and RECIPES["bf16-adamw8bit"].own_optimizer
    assert {n for n in RECIPES if RECIPES[n].needs_ranks} == {"bf16-reduce", "bf16-fsdp", "bf16-fsdp-reduce"}
    assert reduce.reduces_by_hook and not RECIPES["bf16-fsdp-reduce"].reduces_by_hook  # FSDP2 by its policy
    assert RECIPES["bf16-fsdp"].shard and autocast_precision("bf16-fsdp") == "fp32"  # FSDP casts, not autocast
    assert true.lightning == "bf16-true"


def test_every_recipe_is_on_its_docs_page():
    page = (REPO / "docs" / "recipes.md").read_text()
    assert all(f"`{name}`" in page for name in RECIPES)


def test_a_rule_that_names_a_recipes_base_judges_the_recipe_and_one_that_names_the_recipe_only_it():
    from ampcert.certify.rules import AppliesTo

    def judged(precisions, precision):
        return AppliesTo(precisions=precisions).matches("gpt", "gpt", "torch", "native", precision)

    assert judged(["bf16"], "bf16-true") and judged(["bf16"], "bf16-fsdp") and judged(["bf16"], "bf16")
    assert not judged(["fp16"], "bf16-true") and not judged(["fp32"], "bf16-state")
    assert judged(["bf16-true"], "bf16-true") and not judged(["bf16-true"], "bf16-true-sr")
    assert not judged(["bf16-true"], "bf16")  # naming a recipe does not reach its base
