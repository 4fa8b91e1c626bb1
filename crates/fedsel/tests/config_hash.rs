//! The config hash names output directories and keys checkpoints and sweep cells, so
//! moving or restructuring a schema must leave it unchanged. These values were computed
//! on the code before the option types moved out of `config.rs` (commit 69f1df9); the
//! files cover every strategy and every availability model. `examples/trace_f3ast.toml` was
//! re-pinned when its trace path was fixed to be relative to the file (commit after c41a41b).

use std::path::Path;

use fedsel::config::Config;

/// (file under `configs/`, its hash).
const PINNED: &[(&str, &str)] = &[
    (
        "examples/trace_f3ast.toml",
        "c326800919cf575e35f0dfa0d5863b54700be2f6a80449f4e9097fc7f5ae9625",
    ),
    (
        "f3ast/shakespeare_base.toml",
        "ad8e77955997a29854a56132a16440d7dbea157c3e4a1f29594cdf336048091e",
    ),
    (
        "f3ast/synthetic_always_f3ast.toml",
        "8df061b661c7cd7b9380f3a4c50e15edd992b8cfa57baf3995d814de65a9e3a8",
    ),
    (
        "f3ast/synthetic_homedevice_f3ast.toml",
        "ae0c052dc42ca5f53d7c6a685dba95762a68f178d52914d8b1d098ac26d9cb65",
    ),
    (
        "f3ast/synthetic_scarce_fedavg.toml",
        "6c19f199cfee243b7fda318b8d2ad9dd6929016c932fbc608951227209f960ae",
    ),
    (
        "f3ast/synthetic_smartphones_f3ast.toml",
        "0c428fb12aaa165d0d1b836f7360701cd2b0e0b435b1402ee537f0cc02baf114",
    ),
    (
        "f3ast/synthetic_uneven_f3ast.toml",
        "b24ec749bebdbd707ff24e6cf3a615b83e7350ae129750d781d615074bbc5e5d",
    ),
    (
        "fedcor/cifar10_2spc_rand.toml",
        "88912947ff52cf666f964d264f1806cd2a63d00f5cc2e734a2e07d5be48a8c72",
    ),
    (
        "fedcor/fmnist_2spc_afl.toml",
        "e18ee7377b071d158acf97b16ff269210df95a3950ea8dd88d104c4d78c53608",
    ),
    (
        "fedcor/fmnist_2spc_fedcor.toml",
        "544e38bdc1707ae68bd21ab922734704f754c1b4dcc36e71a0b6860f582782d7",
    ),
    (
        "fedcor/fmnist_2spc_powd.toml",
        "6f2f18727a3f0e84a14572161034c0daf6420cfe69632a0cd945089926d9dd90",
    ),
    (
        "fedcor/fmnist_dir_fedcor.toml",
        "e6058e30d8475523faaef1ed963fd5b3e1c3e4f4499b929812b0667d16f34efb",
    ),
    (
        "fedgs/synthetic_idl_fedgs.toml",
        "e70ceaefe7fc69525533e078eacfe8c4c7608aa87b8afedde468468887dbd415",
    ),
    (
        "fedgs/synthetic_ldf_fedgs.toml",
        "f01a59f84c3d0773bfa372ef9ada8ce459213cf44b4dabd71bc2b7204cce7824",
    ),
    (
        "fedgs/synthetic_ln_mdsample.toml",
        "6705eb6d75c2a7ac05bbc4e27d2799f2ac5b55021663cbe5a0cd90e0b0afb58f",
    ),
    (
        "fedgs/synthetic_mdf_fedgs.toml",
        "5953743cb39e1913bc431b7bf7fed57ef08952c708adb229b39f7d96e45976cf",
    ),
    (
        "fedgs/synthetic_sln_powd.toml",
        "a8165b2ca6b9c18b5f61bed1fa6e2d5e649b3aace1c0a24f7d7b033cc579ba55",
    ),
    (
        "hics/fmnist_s1_cs.toml",
        "9b0618d795a84aaeb68ac6235ec434da1556a3c687cf3b24e921c81c9c6f9904",
    ),
    (
        "hics/fmnist_s1_divfl.toml",
        "ab51561692b9d27d177c5d11cc422d2c78ad92fb6ec1031ab40b39160cd78951",
    ),
    (
        "hics/fmnist_s1_hics.toml",
        "37613cf6a3da8ebb0b850707dd568e91e5f0d2881e5e5e41c1fea999fea6d5fd",
    ),
    (
        "hics/fmnist_s2_hics_code.toml",
        "15d6f29a375814d0c4549b020593c20c236bcf618eeeba4bc0299bd6b31af424",
    ),
    (
        "hics/fmnist_s3_random.toml",
        "f5b9bbd4bf14b313740e0e367a41416641c902707eec4ea35db00467465fd967",
    ),
];

#[test]
fn the_default_config_hash_is_pinned() {
    assert_eq!(
        Config::default().hash(),
        "0b0f9293e2a3efcbf20576deae1538fa0bfa59f9f03cedecc324f30ed8eb36fb"
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
