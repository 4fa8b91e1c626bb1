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
        "95721336e83c8aed88e0ef02db99c0c6885ddaff007f9ec0554cfa5b98ea302c",
    ),
    (
        "f3ast/shakespeare_base.toml",
        "f79b86114b004c3cdba2e40ec9e799589a175ed079638cff00cf3bac46d08ef2",
    ),
    (
        "f3ast/synthetic_always_f3ast.toml",
        "2c1784ded40911bcffbd3c0aeafdf6d0372a040d9eebe6436318ce8f5fb4e75d",
    ),
    (
        "f3ast/synthetic_homedevice_f3ast.toml",
        "08828ff2e8f5e54cef62cd990a1e1df4879ea8bfe5ffa99f92124878824d5f38",
    ),
    (
        "f3ast/synthetic_scarce_fedavg.toml",
        "270eae73529b4eb11c14eb0647f9169f518f2016f7048ca43c0d0c9eb040f4df",
    ),
    (
        "f3ast/synthetic_smartphones_f3ast.toml",
        "6cc5eeef8ed5feaba387a4e6ced12fc62348f9b8e37a0dea535bbadbfbd44bf0",
    ),
    (
        "f3ast/synthetic_uneven_f3ast.toml",
        "fafa6e548d97860781cd1253e810c560ee12867e0a09683c356aa7f2c011b637",
    ),
    (
        "fedcor/cifar10_2spc_rand.toml",
        "c28aad17bcd3f3000855a53def83885f59b503416360e29679495879585f32ff",
    ),
    (
        "fedcor/fmnist_2spc_afl.toml",
        "974740cbd78812f9754308cf0f1cf397d24fe0edce34eee3d91ecc477ebedeaf",
    ),
    (
        "fedcor/fmnist_2spc_fedcor.toml",
        "96ae4d828231d1fa8b19a703d9a65944c32ea6dce7864208ca7dd142a0293378",
    ),
    (
        "fedcor/fmnist_2spc_powd.toml",
        "1bc4a87f354684705a9839def49c58bb80ea893b937b455566a1286d0567cd7e",
    ),
    (
        "fedcor/fmnist_dir_fedcor.toml",
        "44311ef5cfba239d71326323dd5dad38975deff74bb24013fb30a835a7064931",
    ),
    (
        "fedgs/synthetic_idl_fedgs.toml",
        "e61c78157138cd9a0620b3875d47d46a155e716a1d91488cf5d3c336928288fa",
    ),
    (
        "fedgs/synthetic_ldf_fedgs.toml",
        "eeda0be4012c66d73c7be419a90d0d48d9f96d6997cc4e25a92f411a8c58f0dd",
    ),
    (
        "fedgs/synthetic_ln_mdsample.toml",
        "34ff2e3e32635ef611d131896c6b8107d4c213ddf9511b3be56345c47f5fefb3",
    ),
    (
        "fedgs/synthetic_mdf_fedgs.toml",
        "7f410fed74f19f3ddfa53d9a7eae08e0124f16549a1b674908c4dfc3c60395f6",
    ),
    (
        "fedgs/synthetic_sln_powd.toml",
        "3384bc3fdc2ac419764f10b147688807cbff9c9d866c58ad3718c5e8618337d1",
    ),
    (
        "hics/fmnist_s1_cs.toml",
        "0fda2debef98e0757efd9a28cea3248a53893890da51296d94c3bea81a135ec5",
    ),
    (
        "hics/fmnist_s1_divfl.toml",
        "afedcf2c31069f47d9befc177aab8427b87550e69faaf6b025463d9f333e68e7",
    ),
    (
        "hics/fmnist_s1_hics.toml",
        "70177b90ecbf54ff1d6f1e31dca5f9b27f50e8d67b5bbda9d5d6d2386803361a",
    ),
    (
        "hics/fmnist_s2_hics_code.toml",
        "0ee042b853ed4c37d05fd9277113820512928dc1ce752d027d1ec84a136d0545",
    ),
    (
        "hics/fmnist_s3_random.toml",
        "56c855572444d7844ff0edf7919313835229a40fcdb4f8ffdebaa0149a81c7c9",
    ),
];

#[test]
fn the_default_config_hash_is_pinned() {
    assert_eq!(
        Config::default().hash(),
        "3b9c94b725f7429d7a478beac260b2b7c44b9ceb27259959a6ccb9b24f5814ca"
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
