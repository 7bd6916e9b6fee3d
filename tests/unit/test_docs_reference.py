"""The generated reference (docs/reference/) and the config's JSON Schema.

`make docs` writes them from the models in rmq_spark/config/ and the parsers in
rmq_spark/cli.py; these tests fail when a model or parser changed and they were not
regenerated, and check that the schema accepts the shipped configs and names a wrong key.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rmq_spark import cli
from rmq_spark.config import parse_config
from rmq_spark.devtools import reference

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "docs" / "reference" / "config.schema.json"


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return schema


def _errors(document: Any) -> list[jsonschema.ValidationError]:
    validator = jsonschema.Draft202012Validator(_schema())
    return list(validator.iter_errors(document))


def test_generated_reference_files_are_current() -> None:
    stale = [str(path.relative_to(REPO)) for path in reference.stale()]
    assert stale == [], f"{stale} differ from what the code generates: run make docs"


def test_config_schema_command_prints_the_committed_schema(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["config-schema"]) == cli.EXIT_VERIFIED
    assert json.loads(capsys.readouterr().out) == _schema()


def test_the_schema_is_a_valid_json_schema_without_the_resolved_password() -> None:
    jsonschema.Draft202012Validator.check_schema(_schema())
    cluster = _schema()["$defs"]["ClusterConfig"]["properties"]
    assert "password_env" in cluster
    assert "password" not in cluster


def test_every_key_has_a_description() -> None:
    schema = _schema()
    models = {"JobConfig": schema, **schema["$defs"]}
    undescribed = [
        f"{model}.{key}"
        for model, body in models.items()
        for key, node in body.get("properties", {}).items()
        if not node.get("description")
    ]
    assert undescribed == []


@pytest.mark.parametrize("name", ["example.yaml", "demo.yaml", "park.yaml"])
def test_shipped_configs_validate_and_name_the_schema(name: str) -> None:
    text = (REPO / "conf" / name).read_text(encoding="utf-8")
    assert text.startswith("# yaml-language-server: $schema=../docs/reference/config.schema.json\n")
    assert _errors(yaml.safe_load(text)) == []


def test_a_wrong_key_fails_validation_naming_it() -> None:
    config = yaml.safe_load((REPO / "conf" / "example.yaml").read_text(encoding="utf-8"))
    wrong = copy.deepcopy(config)
    wrong["routes"][0]["source"]["queue_patern"] = ".*"
    errors = _errors(wrong)
    assert len(errors) == 1
    assert "queue_patern" in errors[0].message
    assert list(errors[0].absolute_path) == ["routes", 0, "source"]


def test_a_bad_value_fails_validation_naming_where() -> None:
    config = yaml.safe_load((REPO / "conf" / "example.yaml").read_text(encoding="utf-8"))
    config["mover"]["queues_per_task"] = 0
    errors = _errors(config)
    assert [list(error.absolute_path) for error in errors] == [["mover", "queues_per_task"]]


def test_the_config_reference_lists_every_key_of_every_section() -> None:
    page = (REPO / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    for section in ("`clusters.<name>`", "`routes[].source`", "`routes[].destination`"):
        assert f"## {section}" in page
    models = _schema()["$defs"]
    for model in models.values():
        for key in model.get("properties", {}):
            assert f"| `{key}` |" in page, f"config.md does not list {key}"


def test_the_cli_reference_lists_every_command_and_option() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    parser = cli.build_parser()
    for name, _summary, sub in reference._subcommands(parser):
        assert f"## `rmq-spark {name}`" in page
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page, f"cli.md does not list {name} {option}"


def test_the_readme_quick_start_config_loads_and_validates() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quick_start = readme[readme.index("## Quick start") :]
    start = quick_start.index("```yaml\n") + len("```yaml\n")
    text = quick_start[start : quick_start.index("\n```", start)]
    assert _errors(yaml.safe_load(text)) == []
    env = {"RMQ_DR_PASSWORD": "dr-secret", "RMQ_MAIN_PASSWORD": "main-secret"}
    config = parse_config(text, env, origin="README.md")
    assert config.federation == "pause"
    assert config.routes[0].source.policy_pattern == "fed"


def test_the_readme_fits_on_a_screen_and_links_only_to_files_that_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    missing = [target for target in targets if not (REPO / target).exists()]
    assert targets
    assert missing == []


def test_the_config_reference_links_only_to_its_own_headings() -> None:
    """Every in-page link of the config reference names a heading's id as MkDocs makes
    it (Python-Markdown's slugify), so no link of the site goes nowhere."""
    from markdown.extensions.toc import slugify

    page = (REPO / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    headings = {
        slugify(line.lstrip("#").strip().replace("`", ""), "-")
        for line in page.splitlines()
        if line.startswith("#")
    }
    links = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert links, "the reference links to none of its sections"
    assert links <= headings, sorted(links - headings)
