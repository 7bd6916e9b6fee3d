"""An object-store ledger's options: resolved from the variables the config names,
handed to delta-rs and pyarrow, and never shown (pure: no server), and removals at once."""

from __future__ import annotations

import pytest

from rmq_spark.config import LedgerConfig, LedgerStorageOptions
from rmq_spark.config.ledger import with_storage_secrets
from rmq_spark.ledger import store
from rmq_spark.ledger.storage import storage_options
from rmq_spark.ledger.store import StoreOptions, StorePath

SECRET = "s3cret-not-for-logs"
OPTIONS = StoreOptions(
    endpoint="http://127.0.0.1:9000",
    region="eu-west-1",
    access_key_id="AKIDEXAMPLE",
    secret_access_key=SECRET,
)


def test_the_options_never_print_their_secrets() -> None:
    shown = f"{OPTIONS!r} {OPTIONS!s} {[OPTIONS]}"
    assert SECRET not in shown
    assert "AKIDEXAMPLE" not in shown
    assert "http://127.0.0.1:9000" in shown


def test_delta_rs_gets_the_endpoint_region_and_keys() -> None:
    assert OPTIONS.delta() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": SECRET,
    }
    # Without options, delta-rs and pyarrow use the platform's provider chain.
    assert StoreOptions().delta() == {}


def test_a_ledger_uri_gets_the_options_registered_for_its_bucket() -> None:
    store.configure("s3://bucket-a/ledger", OPTIONS)
    assert storage_options("s3://bucket-a/ledger/messages") == OPTIONS.delta()
    assert storage_options("s3://bucket-b/ledger/messages") == {}


def test_the_config_resolves_secrets_from_the_named_variables() -> None:
    ledger = LedgerConfig(
        path="s3://bucket/ledger",
        storage_options=LedgerStorageOptions(
            region="eu-west-1", access_key_id_env="KEY_ID", secret_access_key_env="SECRET"
        ),
    )
    resolved = with_storage_secrets(ledger, {"KEY_ID": "AKID", "SECRET": SECRET}, "job.yaml")

    assert StoreOptions.of(resolved.store_values()) == StoreOptions(
        region="eu-west-1", access_key_id="AKID", secret_access_key=SECRET
    )
    assert SECRET not in resolved.model_dump_json()
    assert SECRET not in repr(resolved)


def test_only_both_halves_of_a_key_are_accepted() -> None:
    with pytest.raises(ValueError, match="go together"):
        LedgerStorageOptions(access_key_id_env="KEY_ID")


def test_a_store_path_names_its_bucket_key_parent_and_entry() -> None:
    path = StorePath("s3://bucket/ledger/") / "messages" / "run_id=r1"
    assert str(path) == "s3://bucket/ledger/messages/run_id=r1"
    assert path.fs_path == "bucket/ledger/messages/run_id=r1"
    assert path.name == "run_id=r1"
    assert path.parent == StorePath("s3://bucket/ledger/messages")


AZURE = StoreOptions(
    endpoint="http://127.0.0.1:10000/acct",
    account_name="acct",
    account_key=SECRET,
)


def test_delta_rs_gets_the_azure_account_endpoint_and_key() -> None:
    assert AZURE.delta("az") == {
        "azure_storage_account_name": "acct",
        "azure_storage_endpoint": "http://127.0.0.1:10000/acct",
        "azure_allow_http": "true",
        "azure_storage_account_key": SECRET,
    }
    assert SECRET not in repr(AZURE)


def test_an_abfss_path_names_its_container_and_key_on_the_file_system() -> None:
    path = StorePath("abfss://ledger@acct.dfs.core.windows.net/prefix") / "messages"
    assert path.fs_path == "ledger/prefix/messages"
    assert StorePath("az://ledger/prefix/runs").fs_path == "ledger/prefix/runs"
    assert path.parent == StorePath("abfss://ledger@acct.dfs.core.windows.net/prefix")


def test_pyarrow_reaches_an_emulator_path_style_and_azure_by_host_suffix() -> None:
    assert store.azure_authorities("http://127.0.0.1:10000/acct", "acct") == {
        "blob_storage_authority": "127.0.0.1:10000",
        "dfs_storage_authority": "127.0.0.1:10000",
        "blob_storage_scheme": "http",
        "dfs_storage_scheme": "http",
    }
    suffix = store.azure_authorities("https://acct.blob.core.windows.net", "acct")
    assert suffix["blob_storage_authority"] == ".blob.core.windows.net"
    assert suffix["dfs_storage_authority"] == ".dfs.core.windows.net"


def test_an_abfss_ledger_takes_its_account_from_the_uri() -> None:
    ledger = LedgerConfig(
        path="abfss://ledger@acct.dfs.core.windows.net/rmq",
        storage_options=LedgerStorageOptions(account_key_env="AZ_KEY"),
    )
    resolved = with_storage_secrets(ledger, {"AZ_KEY": SECRET}, "job.yaml")

    assert StoreOptions.of(resolved.store_values()) == StoreOptions(
        account_name="acct", account_key=SECRET
    )
    assert SECRET not in resolved.model_dump_json()


@pytest.mark.parametrize(
    ("path", "options", "expected"),
    [
        ("az://ledger/rmq", {}, "needs ledger.storage_options.account_name"),
        ("az://ledger/rmq", {"account_name": "a", "region": "x"}, "region are not options"),
        ("s3://bucket/rmq", {"account_key_env": "K"}, "account_key_env are not options"),
        ("abfss://ledger/rmq", {}, "expected abfss://container@account"),
        (
            "abfss://ledger@acct.dfs.core.windows.net/r",
            {"account_name": "other"},
            "differs from the account 'acct'",
        ),
        (
            "az://ledger/rmq",
            {"account_name": "acct", "endpoint": "http://127.0.0.1:10000"},
            "expected an account's blob service",
        ),
        ("az://ledger/rmq", {"account_name": "a", "account_key": "x"}, "must not be in"),
    ],
)
def test_azure_ledger_options_that_do_not_fit_are_refused(
    path: str, options: dict[str, str], expected: str
) -> None:
    with pytest.raises(ValueError, match=expected):
        LedgerConfig.model_validate({"path": path, "storage_options": options})


def test_the_demo_command_offers_the_ledgers_the_demo_can_start() -> None:
    from rmq_spark.demo_command import DEMO_LEDGERS
    from rmq_spark.devtools.demo_store import LEDGERS

    assert DEMO_LEDGERS == LEDGERS
