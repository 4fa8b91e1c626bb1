//! The config hash names output directories and keys checkpoints and sweep cells, so
//! moving or restructuring a schema must leave it unchanged. These values were computed
//! on the code before the option types moved out of `config.rs` (commit 69f1df9); the
//! files cover every strategy and every availability model. `examples/trace_f3ast.toml` was
//! re-pinned when its trace path was fixed to be relative to the file (commit after c41a41b).
//! A new key changes every resolved config, so every pin moves when one is added: all were
//! re-pinned for `selection.client_size` (issue 22), with no other change to the schema.
//! `hics/fmnist_s2_hics_code.toml` was re-pinned when the file itself gained the HiCS-FL
//! code's FMNIST normalisation (`dataset.normalize = "half"`, issue 41): a changed file, not
//! a changed schema.

use std::path::Path;

use fedsel::config::Config;

/// (file under `configs/`, its hash).
const PINNED: &[(&str, &str)] = &[
    (
        "examples/trace_f3ast.toml",
        "c1843077d7349d909b8d0abc75e79934f51fc20fe38d39323b4ee8ee7ea79d2a",
    ),
    (
        "f3ast/shakespeare_base.toml",
        "5a90412e5195148243e4213fb5e130400db179d3a1cb2f1ac18de6d42f11ff69",
    ),
    (
        "f3ast/synthetic_always_f3ast.toml",
        "89dc6684904b47d038925c1db109549377fa3f5e1cc4f4c477d96955355e3543",
    ),
    (
        "f3ast/synthetic_homedevice_f3ast.toml",
        "bdc6556b42a8f0febddefc106c4df4403efb379d7553651d107723572d8917a6",
    ),
    (
        "f3ast/synthetic_scarce_fedavg.toml",
        "1cd70f04532b522eae13d2115261e13d7deaaed9a01a00fc4995bc6102830eef",
    ),
    (
        "f3ast/synthetic_smartphones_f3ast.toml",
        "7963b4db3bc5b6ba64cfd3b111d92c575a4ee99ef3d41c680fbb64a1a7005e52",
    ),
    (
        "f3ast/synthetic_uneven_f3ast.toml",
        "a6bf1fccbb65b50bbd85855417591b333979cf19563dce1ff1709710107d3c2f",
    ),
    (
        "fedcor/cifar10_2spc_rand.toml",
        "405670eddd91f451f94e488b4fc5d12d2e709bff767e60225be8d8ea26e568d1",
    ),
    (
        "fedcor/fmnist_2spc_afl.toml",
        "80606977d0c513e5b8fae6e46cf653f322042843db4b01f545ae8313b06cd65a",
    ),
    (
        "fedcor/fmnist_2spc_fedcor.toml",
        "662682f42dabb396dc0c43e1218cd0456af5f7d1f10cbe295c6a3fe458ead605",
    ),
    (
        "fedcor/fmnist_2spc_powd.toml",
        "3a7a1b4a41e2b531c9dfdd4edfe4f6d7912255fabce1dfea5666ef863c54434a",
    ),
    (
        "fedcor/fmnist_dir_fedcor.toml",
        "6585a59777e13093a7707e81a267e74c689033a8981a7de626633cf224a6581f",
    ),
    (
        "fedgs/synthetic_idl_fedgs.toml",
        "98f42dc2b982586a70c69202e8760818773653ab26b323f8e07f8049c4c052d3",
    ),
    (
        "fedgs/synthetic_ldf_fedgs.toml",
        "fdb43f83a8560f6196a9b77bd32c9f348bf6308c6cf226b05c2630352ccda1fb",
    ),
    (
        "fedgs/synthetic_ln_mdsample.toml",
        "2c54dcdcc7cdc3f496acba1bac774cdaf278538545df76fcc3026739f8a8e75a",
    ),
    (
        "fedgs/synthetic_mdf_fedgs.toml",
        "04943576ca3310d9adb67704c1a4971a2e8216c98cd7756f2487b49678b70d4f",
    ),
    (
        "fedgs/synthetic_sln_powd.toml",
        "571dfd6a861d9834eb1a9f8670cf3dcd1b95fd2cf3b026c4cf68caba4f536c70",
    ),
    (
        "hics/fmnist_s1_cs.toml",
        "1b5128688487fdb1f2cc228e6784228cd38f6a4651a54af027d542692c4567d0",
    ),
    (
        "hics/fmnist_s1_divfl.toml",
        "afa1b5245790e342bf90c6f2815a06f78940b541d2680d1a69388106ff2639f3",
    ),
    (
        "hics/fmnist_s1_hics.toml",
        "49578c1a4027e6bda2fed251d9b0d8e1c1ca07f7386ae597ea04c92e82ab31af",
    ),
    (
        "hics/fmnist_s2_hics_code.toml",
        "6a93bb4c14f8cde78d68ea4914ae50cc750dcb8011c70658c255f4d2e450e0cc",
    ),
    (
        "hics/fmnist_s3_random.toml",
        "fa17704e0584630620d33c59fad7a712f6e6904e0f04cd8a15d39b83880e4b33",
    ),
];

#[test]
fn the_default_config_hash_is_pinned() {
    assert_eq!(
        Config::default().hash(),
        "d166e9a8905a7cfd40210f57a0a67c37ffb30f2ef2cc42d243b569d4ec9b45fb"
    );
}

#[test]
fn shipped_config_hashes_are_pinned() {
    // Relative, as cargo runs tests from the crate's directory: a config file's relative trace
    // path is anchored to the file's directory, and so enters the hash as this path.
    let root = Path::new("../../configs");
    for &(file, hash) in PINNED {
        let c = Config::load(Some(&root.join(file)), &[]).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(c.hash(), hash, "{file}: the config hash changed");
    }
}
