"""logstore/cli/archive.py and the archive/groupId source options: ``logstore archive`` hands
the job exactly the options it parsed, and the source's new options parse or fail naming
themselves. Pure: no Spark, no broker."""

from __future__ import annotations

import argparse

import pytest

from datasource.iceberg import ArchiveCatalogError, catalog_settings
from datasource.options import OptionError, parse_read_options
from logstore.cli import build_parser
from logstore.cli.archive import add_archive_arguments, job_argv, positive_size, seconds

BASE = {"bootstrap.servers": "h:1", "subscribe": "t"}


def _job_parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_archive_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("argv", [
    ["--topic", "a", "--topic", "b", "--table", "ns.t", "--warehouse", "/w"],
    ["--topic-pattern", "x.*", "--table", "ns.t", "--catalog", "uri=sqlite:///c.db",
     "--catalog", "@props.json", "--warehouse", "s3://b/w", "--mode", "stream",
     "--trigger-interval", "2.5", "--target-file-size", "64m", "--partition-by", "date",
     "--no-fail-on-data-loss", "--isolation-level", "read_committed", "--master", "local[1]",
     "--no-progress", "--bootstrap-server", "h:9"],
])
def test_logstore_archive_passes_the_job_the_options_it_parsed(argv: list[str]) -> None:
    """Goal: ``logstore archive`` and ``python -m jobs.archive`` take the same options and
    the CLI hands them over unchanged. Method: parse with the logstore parser, rebuild the
    job's argv, parse that with the job's parser: every option equal."""
    cli = build_parser().parse_args(["archive", *argv])
    job = _job_parse(job_argv(cli))
    assert {k: v for k, v in vars(job).items()} == \
        {k: v for k, v in vars(cli).items() if k in vars(job)}


def test_sizes_and_bad_sizes() -> None:
    """Goal: --target-file-size takes 128m, 1g, 4096 and refuses 0 or text. Method: direct."""
    assert positive_size("128m") == 128 * 1024 * 1024
    assert positive_size("1GiB") == 1024**3 and positive_size("4096") == 4096
    for bad in ("0", "lots", "-1k", "inf", "nan", "-inf"):  # inf was an OverflowError
        with pytest.raises(argparse.ArgumentTypeError):
            positive_size(bad)


def test_seconds_refuse_what_is_not_a_positive_finite_number() -> None:
    assert seconds("2.5s") == 2.5
    for bad in ("nan", "inf", "0", "-1", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            seconds(bad)


def test_an_infinite_target_file_size_is_a_usage_error_naming_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["archive", "--topic", "t", "--table", "ns.t",
                                   "--target-file-size", "inf"])
    assert exited.value.code == 2 and "--target-file-size" in capsys.readouterr().err


def test_default_catalog_is_sqlite_in_a_local_warehouse(tmp_path: object) -> None:
    """Goal: with only --warehouse PATH the catalog is SQL on SQLite inside it, with fsspec
    IO; an s3:// warehouse needs a catalog uri, said by name. Method: catalog_settings."""
    props = catalog_settings([], str(tmp_path)).properties
    assert props["type"] == "sql" and props["uri"] == f"sqlite:///{tmp_path}/catalog.db"
    assert props["warehouse"] == f"file://{tmp_path}"
    assert props["py-io-impl"] == "pyiceberg.io.fsspec.FsspecFileIO"
    with pytest.raises(ArchiveCatalogError, match="needs uri=sqlite"):
        catalog_settings([], "s3://bucket/w")
    with pytest.raises(ArchiveCatalogError, match="expected key=value"):
        catalog_settings(["oops"], str(tmp_path))


def test_source_archive_and_group_options_parse_or_name_the_option() -> None:
    """Goal: groupId (stream), archiveTable/archiveWarehouse/archive.catalog.* (batch) parse;
    misuse fails naming the option. Method: parse_read_options."""
    stream = parse_read_options({**BASE, "groupId": "g"}, True)
    assert stream.group_id == "g"
    batch = parse_read_options({**BASE, "archiveTable": "ns.t", "archiveWarehouse": "/w",
                                "archive.catalog.uri": "sqlite:///x"}, False)
    assert (batch.archive_table, batch.archive_warehouse, batch.archive_catalog) == \
        ("ns.t", "/w", (("uri", "sqlite:///x"),))
    with pytest.raises(OptionError, match="groupId"):
        parse_read_options({**BASE, "groupId": "g"}, False)
    with pytest.raises(OptionError, match="need archiveTable"):
        parse_read_options({**BASE, "archiveWarehouse": "/w"}, False)
    with pytest.raises(OptionError, match="archiveTable must be namespace.name"):
        parse_read_options({**BASE, "archiveTable": "flat"}, False)
