//! The Rust lines of docs/bindings.md (quoted by the README) are the crate's doc example, which
//! cargo test compiles and runs.
#[test]
fn docs_show_the_crate_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../..");
    let docs = std::fs::read_to_string(format!("{root}/docs/bindings.md")).expect("docs/bindings.md");
    let lib = include_str!("../src/lib.rs");
    let start = docs.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &docs[start..start + docs[start..].find("```").unwrap()];
    let lines: Vec<&str> = block.trim().lines().collect();
    assert_eq!(lines.len(), 5);
    for line in lines {
        assert!(lib.contains(&format!("//! {line}\n")), "the documented line {line:?} is not the crate example's");
    }
}

#[test]
fn docs_show_the_variants_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../..");
    let docs = std::fs::read_to_string(format!("{root}/docs/bindings.md")).expect("docs/bindings.md");
    let section = &docs[docs.find("## Variants").expect("a Variants section")..];
    let source = include_str!("../src/variants.rs");
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    for line in block.trim().lines() {
        assert!(source.contains(&format!("//! {line}\n")), "the documented line {line:?} is not variants.rs's example");
    }
}

#[test]
fn docs_show_the_merge_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../..");
    let docs = std::fs::read_to_string(format!("{root}/docs/bindings.md")).expect("docs/bindings.md");
    let section = &docs[docs.find("## Merging partial results").expect("a merge section")..];
    let source = include_str!("../src/merge.rs");
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    for line in block.trim().lines() {
        assert!(source.contains(&format!("//! {line}\n")), "the documented line {line:?} is not merge.rs's example");
    }
}

#[test]
fn docs_show_the_kvcache_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../..");
    let docs = std::fs::read_to_string(format!("{root}/docs/bindings.md")).expect("docs/bindings.md");
    let section = &docs[docs.find("## KV cache").expect("a KV cache section")..];
    // The section ends at the next one; the other languages' blocks in it are theirs.
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |n| n + 1)];
    let source = include_str!("../src/kvcache.rs");
    let start = section.find("```rust\n").expect("a rust block in the KV cache section") + "```rust\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    let lines: Vec<&str> = block.trim().lines().collect();
    assert!(lines.iter().any(|l| l.contains("forward_kvcache")), "the KV cache block does not call forward_kvcache");
    for line in lines {
        assert!(source.contains(&format!("//! {line}\n")), "the documented line {line:?} is not kvcache.rs's example");
    }
}
