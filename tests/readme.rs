//! README.md as a new user reads it: an application made of its `Cargo.toml` lines and its Rust
//! blocks, exactly as written, builds without a warning, and its test passes.
//!
//! Each Rust block is a whole file: a program (`fn main`) becomes `src/bin/<heading>.rs`, a test
//! file `tests/<heading>.rs`. The `toml` blocks are `Cargo.toml` lines, a later line for a
//! dependency replacing the earlier one, as the README says to change it. The install lines
//! (`git = "https://github.com/lockmacro/lockmacro"`) become paths to this workspace, its
//! `Cargo.lock` pins the same versions offline, and the build shares this workspace's target
//! directory and profile, so only what the application's features change is compiled again.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How the README names the repository in its install lines.
const INSTALL_SOURCE: &str = r#"git = "https://github.com/lockmacro/lockmacro""#;

/// One fenced block of the README, with the heading it stands under.
struct Block {
    heading: String,
    language: String,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut heading = String::new();
    let mut open: Option<Block> = None;
    for line in markdown.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    heading: heading.clone(),
                    language: info.split(',').next().unwrap_or_default().trim().to_owned(),
                    text: String::new(),
                });
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {
                if line.starts_with('#') {
                    heading = line.trim_start_matches('#').trim().to_owned();
                }
            }
        }
    }
    assert!(open.is_none(), "README.md ends inside a fenced block");
    blocks
}

/// `On an axum handler` -> `on_an_axum_handler`.
fn file_name(heading: &str) -> String {
    let name: String = heading
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    name.split('_')
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

/// A `toml` line without its comment; `None` when nothing is left.
fn toml_content(line: &str) -> Option<&str> {
    let content = line.split(" #").next().unwrap_or_default().trim();
    (!content.is_empty() && !content.starts_with('#')).then_some(content)
}

/// The `[dependencies]` and `[dev-dependencies]` lines of every `toml` block, in order; a later
/// line for a name already given replaces it where it stood.
fn dependency_tables(blocks: &[Block], workspace: &Path) -> String {
    let mut tables: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for block in blocks.iter().filter(|block| block.language == "toml") {
        let mut table = None;
        for line in block.text.lines().filter_map(toml_content) {
            if line.starts_with('[') {
                let name = line.to_owned();
                let index = match tables.iter().position(|(known, _)| *known == name) {
                    Some(index) => index,
                    None => {
                        tables.push((name, Vec::new()));
                        tables.len() - 1
                    }
                };
                table = Some(index);
                continue;
            }
            let table = table.unwrap_or_else(|| {
                panic!(
                    "a `toml` block under `{}` starts outside a table",
                    block.heading
                )
            });
            let (name, _) = line.split_once('=').unwrap_or_else(|| {
                panic!("`{line}` (under `{}`) is no `name = value`", block.heading)
            });
            let runtime = workspace.join("lockmacro-runtime");
            let line = line.replace(INSTALL_SOURCE, &format!("path = {:?}", runtime));
            let lines = &mut tables[table].1;
            match lines.iter_mut().find(|(known, _)| known == name.trim()) {
                Some(known) => known.1 = line,
                None => lines.push((name.trim().to_owned(), line)),
            }
        }
    }
    tables
        .iter()
        .map(|(table, lines)| {
            let lines: Vec<_> = lines.iter().map(|(_, line)| line.as_str()).collect();
            format!("{table}\n{}\n", lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes `contents` unless the file holds them already: an unchanged file keeps its time, so
/// cargo does not build it again.
fn write_if_changed(path: &Path, contents: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(contents) {
        fs::write(path, contents).unwrap();
    }
}

/// Writes the application: `cargo new`'s manifest (its own workspace, as it would be outside
/// this one) with the README's lines, and one file per Rust block.
fn write_app(app: &Path, readme: &str, workspace: &Path) -> Vec<String> {
    let blocks = blocks(readme);
    fs::create_dir_all(app.join("src/bin")).unwrap();
    fs::create_dir_all(app.join("tests")).unwrap();
    let manifest = format!(
        "[package]\nname = \"readme-app\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
         [workspace]\n\n{}",
        dependency_tables(&blocks, workspace)
    );
    write_if_changed(&app.join("Cargo.toml"), &manifest);
    let lock = fs::read_to_string(workspace.join("Cargo.lock")).unwrap();
    write_if_changed(&app.join("Cargo.lock"), &lock);
    let mut tests = Vec::new();
    let mut written = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        if block.language != "rust" {
            continue;
        }
        let hidden: Vec<_> = block
            .text
            .lines()
            .filter(|line| *line == "#" || line.trim_start().starts_with("# "))
            .collect();
        assert!(
            hidden.is_empty(),
            "the Rust block under `{}` has rustdoc-hidden lines, which do not paste: {hidden:?}",
            block.heading
        );
        let name = format!("{}_{index}", file_name(&block.heading));
        let path = if block.text.contains("fn main(") {
            app.join("src/bin").join(format!("{name}.rs"))
        } else if block.text.contains("#[tokio::test") || block.text.contains("#[test]") {
            tests.push(name.clone());
            app.join("tests").join(format!("{name}.rs"))
        } else {
            panic!(
                "the Rust block under `{}` is neither a program (`fn main`) nor a test file: \
                 make it one that pastes into a new crate",
                block.heading
            )
        };
        write_if_changed(&path, &block.text);
        written.push(path);
    }
    // Files of blocks the README no longer has.
    for dir in ["src/bin", "tests"] {
        for entry in fs::read_dir(app.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if !written.contains(&path) {
                fs::remove_file(path).unwrap();
            }
        }
    }
    write_if_changed(&app.join("src/main.rs"), "fn main() {}\n");
    tests
}

#[test]
fn readme_blocks_build_into_a_new_app_and_its_test_passes() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
    let app = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-app");
    let readme = fs::read_to_string(workspace.join("README.md")).unwrap();
    let tests = write_app(&app, &readme, &workspace);
    assert!(!tests.is_empty(), "README.md shows no test of users' code");

    // Builds every program and test file, then runs the tests; the workspace's dev profile, so
    // the dependencies built for this workspace's tests are reused. Without the variables cargo
    // sets for this test: build scripts that watch one (ring's watches CARGO_MANIFEST_DIR) would
    // otherwise run again, here and in the workspace's next build.
    let mut cargo = Command::new(env!("CARGO"));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_this_test = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
            || [
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&name.as_ref());
        if set_for_this_test {
            cargo.env_remove(name.as_ref());
        }
    }
    let output = cargo
        .current_dir(&app)
        .env("CARGO_TARGET_DIR", target)
        .env("CARGO_TERM_COLOR", "never")
        // Integration tests build the programs too, as programs.
        .args(["test", "--offline", "--test", "*"])
        .args(["--config", "profile.dev.debug=\"line-tables-only\""])
        .args(["--config", "profile.dev.package.\"*\".debug=false"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the README's application failed ({}):\n{stderr}\n{stdout}",
        app.display()
    );
    let warnings: Vec<_> = stderr
        .lines()
        .filter(|line| line.starts_with("warning"))
        .collect();
    assert!(
        warnings.is_empty(),
        "the README's application builds with warnings:\n{stderr}"
    );
    for test in &tests {
        assert!(
            stderr.contains(&format!("Running tests/{test}.rs")),
            "tests/{test}.rs did not run:\n{stderr}\n{stdout}"
        );
    }
    assert!(stdout.contains("test result: ok"), "{stdout}");
}

/// The rustdoc front page gives the same install lines as README.md, which the test above
/// builds: the repository, tokio with the features the examples need, thiserror.
#[test]
fn the_front_pages_install_lines_are_the_readmes() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(workspace.join("README.md")).unwrap();
    let front_page: String = fs::read_to_string(workspace.join("lockmacro-runtime/src/lib.rs"))
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| format!("{}\n", line.strip_prefix(' ').unwrap_or(line)))
        .collect();
    let install_lines = |markdown: &str| -> Vec<String> {
        let blocks = blocks(markdown);
        let toml = blocks.iter().filter(|block| block.language == "toml");
        toml.flat_map(|block| block.text.lines().filter_map(toml_content))
            .filter(|line| !line.starts_with('['))
            .map(str::to_owned)
            .collect()
    };
    let readme_lines = install_lines(&readme);
    let front_lines = install_lines(&front_page);
    assert!(
        front_lines.iter().any(|line| line.contains(INSTALL_SOURCE)),
        "the front page gives no install line from the repository: {front_lines:?}"
    );
    for line in &front_lines {
        assert!(
            readme_lines.contains(line),
            "the front page's `{line}` is not among README.md's install lines {readme_lines:?}"
        );
    }
}
