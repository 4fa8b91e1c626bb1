//! The config hash names output directories and keys checkpoints and sweep cells, so
//! moving or restructuring a schema must leave it unchanged. These values were computed
//! on the code before the option types moved out of `config.rs` (commit 69f1df9); the
//! files cover every strategy and every availability model. `examples/trace_f3ast.toml` was
//! re-pinned when its trace path was fixed to be relative to the file (commit after c41a41b).
//! A new key changes every resolved config, so every pin moves when one is added: all were
//! re-pinned for `selection.client_size` (issue 22), with no other change to the schema.

use std::path::Path;

use fedsel::config::Config;

/// (file under `configs/`, its hash).
const PINNED: &[(&str, &str)] = &[
    (
        "examples/trace_f3ast.toml",
        "916a1b00316b5d4b7ed9f290dc674e3807acec4157e6b6e1ca4200347f4d9b6f",
    ),
    (
        "f3ast/shakespeare_base.toml",
        "88a870793b47ed60cd91e37b3d883694583ed9ef511bfc84cb9f927558eff154",
    ),
    (
        "f3ast/synthetic_always_f3ast.toml",
        "85b791ff1e1fed07dec7fd4fc60f171be7cd15907e5a6914c1e0d4151fbc5256",
    ),
    (
        "f3ast/synthetic_homedevice_f3ast.toml",
        "883ac26f18409dd3336a5a908665fc2b9f675bd048ad9549e31930b476173f26",
    ),
    (
        "f3ast/synthetic_scarce_fedavg.toml",
        "67e7f147466243b983482a78002df805d2810126fc54b736464dcf70317ab420",
    ),
    (
        "f3ast/synthetic_smartphones_f3ast.toml",
        "87ff904b78cf7b1e2580c22f6b237785ff871281d52565c70d6cf5b07d7357b5",
    ),
    (
        "f3ast/synthetic_uneven_f3ast.toml",
        "0eb9a3a6ecb3a7012417f66209c79d3a3977665174b87aab5344500d5d611d20",
    ),
    (
        "fedcor/cifar10_2spc_rand.toml",
        "06bb2dc687e8cf929828f2dbd09035d9a14148b3bb9bc0ae7b5920881e794507",
    ),
    (
        "fedcor/fmnist_2spc_afl.toml",
        "10c84c519685ab25a3d38e13ddcfa7cd98a69beb6025ff73a1ef313e85a79f37",
    ),
    (
        "fedcor/fmnist_2spc_fedcor.toml",
        "585895da704fb9f2c4c2a78298e412207b388f0cd3355fabba5c42c211320944",
    ),
    (
        "fedcor/fmnist_2spc_powd.toml",
        "ff63bbc13458758556e0fb1466237df66c49d5ae6f1f073897e5a406913fb357",
    ),
    (
        "fedcor/fmnist_dir_fedcor.toml",
        "636ce13848acbd7e66ab8cff681065dc3e8183942bd15f2c63995be0c3c982e3",
    ),
    (
        "fedgs/synthetic_idl_fedgs.toml",
        "ed30fdd7002d7e755ea2b29e6454a2ae68af881a35f3411fa0e8a974f0873323",
    ),
    (
        "fedgs/synthetic_ldf_fedgs.toml",
        "824dfff15b4cc709c32e7dfc7f028caf2ded2aaa31e0d8be61be75801b1d4c05",
    ),
    (
        "fedgs/synthetic_ln_mdsample.toml",
        "385e6a930383c1cbe48480d3231d1f044aa08a28d1f109b7f727df329f3c297b",
    ),
    (
        "fedgs/synthetic_mdf_fedgs.toml",
        "4c9dcf90f2643e77aca68bee6c5089df2c05f8f1fdd1bdc0e1bbc812b2e87a74",
    ),
    (
        "fedgs/synthetic_sln_powd.toml",
        "b4ab8ceaf4f41c7eba812a1674c377ab7ba99ae27b8c1d6885d9844e75d5eba8",
    ),
    (
        "hics/fmnist_s1_cs.toml",
        "5b7db366d601a2fe278de1c3068c4ae98c8f511970610cf666b946aa21ac35f7",
    ),
    (
        "hics/fmnist_s1_divfl.toml",
        "94a1f466f43fafcc94e67d86c5c8921724debd48e8a66d3bb67360b74ca086ba",
    ),
    (
        "hics/fmnist_s1_hics.toml",
        "52eb4ad8b2642ed61dadaa63ca757e5d1ce495c5863ab141eb1a0dd3917173da",
    ),
    (
        "hics/fmnist_s2_hics_code.toml",
        "f2418d1dd0444399a8f6736b877d602d399b1d32d5bd04050333cfbeb0e904c7",
    ),
    (
        "hics/fmnist_s3_random.toml",
        "f5abfab0ab08ee94c3fe70a677c46e1186f95d38580945edb564da17ea1eee66",
    ),
];

#[test]
fn the_default_config_hash_is_pinned() {
    assert_eq!(
        Config::default().hash(),
        "051f9f43d922b60a49e7ce6f4d03d6d9e416acc58fdaaf7370049dc944530b2e"
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
