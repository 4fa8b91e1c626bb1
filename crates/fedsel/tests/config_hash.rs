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
        "7c0e6047023d79cd2b79a401adf24e511afb94087dea5cef14aaab068cec25e5",
    ),
    (
        "f3ast/shakespeare_base.toml",
        "ec996cce2854e7bd2f4a5cd0289aa662840911e75b1fdb7e90507b7eca6bac7c",
    ),
    (
        "f3ast/synthetic_always_f3ast.toml",
        "46faa1af98fde96fe898e1f2da6780e599d4d19b5cfd0559b9ba7b39ec5e290b",
    ),
    (
        "f3ast/synthetic_homedevice_f3ast.toml",
        "fc11381af0d5438f7818e73d13739fd089223babb88adb38cc78abd4ceccb326",
    ),
    (
        "f3ast/synthetic_scarce_fedavg.toml",
        "1400bd7d55d89671175977970c66c7a857767366eafa8f556946d1b0fe8aef16",
    ),
    (
        "f3ast/synthetic_smartphones_f3ast.toml",
        "eb6810cb765644d1991cec74f626410d8cf0f133521e309e182479d1d93444b5",
    ),
    (
        "f3ast/synthetic_uneven_f3ast.toml",
        "7a264d3855714e6e52208c4ca446433094176a34c99a71fe2d6762549fa6adb6",
    ),
    (
        "fedcor/cifar10_2spc_rand.toml",
        "bc69f889bae7c2f4aae02c064fc8d17d8631cc727ac111d6b1e825bca05d95cf",
    ),
    (
        "fedcor/fmnist_2spc_afl.toml",
        "3d960c037a934aad960a523d93a17b23c274739c5baa09616412c7c1348278d1",
    ),
    (
        "fedcor/fmnist_2spc_fedcor.toml",
        "48589c0ad1e4e88157fd739bad4c378e53b0dfbe4edcb53f5358c12ccf337993",
    ),
    (
        "fedcor/fmnist_2spc_powd.toml",
        "a5b983fd1b64a060da21ce0b38980819c3385955cd488d06d461ce44bc1171f4",
    ),
    (
        "fedcor/fmnist_dir_fedcor.toml",
        "82beeecb5431bd8dea4751a8960aadd978efd1ffb2cd07580f7bc4ba77d83d56",
    ),
    (
        "fedgs/synthetic_idl_fedgs.toml",
        "c10aa44e1f2f528947627c4619c6a12b786774133cc9774d45e9414909ef0d01",
    ),
    (
        "fedgs/synthetic_ldf_fedgs.toml",
        "232821be6dfd1507a04d26471372d07c801fa0eae2e19f0e0c1afff4ba68dfe4",
    ),
    (
        "fedgs/synthetic_ln_mdsample.toml",
        "4dc5f38120108fd742b2f25e0316b8a9bfa865b1765b0a1e4856c9e3e803cef1",
    ),
    (
        "fedgs/synthetic_mdf_fedgs.toml",
        "415c1fd98d015055950f32fca1f3c97a6970286995a268646046047bf89bb0d1",
    ),
    (
        "fedgs/synthetic_sln_powd.toml",
        "924dc02d6827271f3eb330f6362c9df1fc7f72876c5fa26564ef17633fc65711",
    ),
    (
        "hics/fmnist_s1_cs.toml",
        "96541330d67d3d2674de152b4a5eb61945f2d31bd549e25d7c55143731d7b7e3",
    ),
    (
        "hics/fmnist_s1_divfl.toml",
        "89435a40224b4ee01a61992716cf9fafc4cf8127e42d7c0696e24998143a45f8",
    ),
    (
        "hics/fmnist_s1_hics.toml",
        "0c81dfbbbbbda6dae48896225faffc15bf6b617760abed0bea88cc68ad900928",
    ),
    (
        "hics/fmnist_s2_hics_code.toml",
        "b461c8a0a79282c0e65d632337bef5be120cfd4321279a67a14f4cd335f06881",
    ),
    (
        "hics/fmnist_s3_random.toml",
        "e4e302f60ad1ae1aa33d377ba97bef0994c08694e0a4b9777b266a1b02724f95",
    ),
];

#[test]
fn the_default_config_hash_is_pinned() {
    assert_eq!(
        Config::default().hash(),
        "197253ead6fcf4168e54d2e712341ed343db3794cfdf25cc2de0509ce280f7b4"
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
