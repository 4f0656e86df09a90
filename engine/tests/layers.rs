//! The engine's module layers, checked on every `cargo test`.
//!
//! This test reads `engine/src` as source (with `syn`, so comments, strings and doc links
//! never count), builds the graph of which module imports which, and fails on:
//!
//! - **circle**: an import circle between units (a unit is a top-level module of the crate,
//!   or a sub-module of `transport/`);
//! - **layer**: a unit importing a unit of a higher layer ([`LAYERS`]);
//! - **backend**: one backend (`ring`, `native`, `jaccl`) importing another's insides; what
//!   two backends share belongs in `transport/` or `comm/`.
//!
//! An import is any path in code that starts with `crate::`, `super::` or `self::` (in a
//! `use`, a type, an expression, a pattern, or the tokens of a macro call), and any `use`
//! of a child module or of a name a module imported; paths through re-exports are followed
//! to the module that defines the item (`crate::hostfile`, which `lib.rs` re-exports, is
//! `config::hostfile`). `mod` declarations are not imports. Code under `#[cfg(test)]` is
//! left out: a test may build its fixtures from any layer.
//!
//! [`KNOWN`] lists the violations the tree is allowed, one entry per (rule, from, to) or
//! per circle; it is empty, and stays so. The test fails on a violation the list does not
//! have, and on an entry that no longer occurs, so that a list ever needed for a staged
//! move can only shrink.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The layers of `engine/src`, lowest first: a unit may import its own layer and the ones
/// below. Keys are module paths under `crate` (the longest matching prefix of a unit
/// wins); `crate` is `lib.rs` itself. A module missing here fails the test, so that every
/// new module is placed on purpose.
const LAYERS: &[(&str, u8)] = &[
    // L0 base: no knowledge of links, transports or backends.
    ("error", 0),
    ("element", 0),
    ("reduce", 0),
    ("config", 0),
    ("options", 0),
    ("verbose", 0),
    // The keyed handshake, sans-IO.
    ("auth", 0),
    // L1: what every transport and backend shares, knowing none of them.
    ("comm", 1),
    // The flight recorder: a `Communicator` around any other, below the `Group` that owns it.
    ("recorder", 1),
    // L2 API: `Group` and its nonblocking scope, over any `Communicator`. It sits below
    // what implements it, so that a backend or a formation can hand up a `Group` without
    // an import back up.
    ("group", 2),
    ("nonblocking", 2),
    // L3 transports: tcp/, shm/, rdma/.
    ("transport", 3),
    // L4 backends.
    ("ring", 4),
    ("native", 4),
    ("jaccl", 4),
    // L5 formation: a group from the environment, and re-formation.
    ("backend", 5),
    ("split", 5),
    ("shrink", 5),
    // L6 the crate root, and the hidden entry points of the fuzz targets.
    ("fuzzing", 6),
    ("crate", 6),
];

/// The backends: none may import another's insides.
const BACKENDS: &[&str] = &["ring", "native", "jaccl"];

/// A violation the tree has today.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Known {
    /// A unit imports a higher layer: (from, to).
    Layer(&'static str, &'static str),
    /// A backend imports another backend: (from, to).
    Backend(&'static str, &'static str),
    /// The units of one import circle, sorted.
    Circle(&'static [&'static str]),
}

/// Allowed violations, each with the move that ends it (none: the tree keeps every rule).
const KNOWN: &[Known] = &[];

// ---------------------------------------------------------------------------------------
// Reading the module tree.

/// A module path under `crate` (empty for the crate root).
type ModPath = Vec<String>;

/// One module as the source declares it.
#[derive(Debug, Default)]
struct Module {
    /// Its child modules (out-of-line and inline, test modules left out).
    children: BTreeSet<String>,
    /// The names its module-level `use` items bring in, each with the path it names as
    /// written (`None`: a glob).
    uses: BTreeMap<String, Vec<String>>,
}

/// A path in code that may name another module, where it stands.
#[derive(Clone, Debug)]
struct Ref {
    /// The module it is written in.
    module: ModPath,
    /// The path as written, from its first segment.
    path: Vec<String>,
    /// The file, relative to the crate's directory, and the line.
    file: String,
    line: usize,
    /// Whether it is a `pub use` (of any visibility): re-exporting a module's own
    /// descendant is not an import of it.
    reexport: bool,
}

/// The whole tree: modules and every path that may cross between them.
#[derive(Debug, Default)]
struct Tree {
    modules: BTreeMap<ModPath, Module>,
    refs: Vec<Ref>,
    /// Files that were declared but could not be read or parsed.
    errors: Vec<String>,
}

/// Whether `attrs` put the item under `cfg(test)` (alone or in an `all(...)`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    fn requires_test(tokens: TokenStream) -> bool {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        match trees.as_slice() {
            [TokenTree::Ident(i)] => i == "test",
            [TokenTree::Ident(i), TokenTree::Group(g)] if i == "all" => {
                let mut arg = TokenStream::new();
                let mut args = Vec::new();
                for t in g.stream() {
                    match &t {
                        TokenTree::Punct(p) if p.as_char() == ',' => {
                            args.push(std::mem::take(&mut arg));
                        }
                        _ => arg.extend([t]),
                    }
                }
                args.push(arg);
                args.into_iter().any(requires_test)
            }
            _ => false,
        }
    }
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if requires_test(l.tokens.clone()))
    })
}

/// The `#[path = "..."]` of a module declaration.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Flattens a `use` tree into (path, the name it binds or `None` for a glob, line).
fn flatten(prefix: &mut Vec<String>, tree: &syn::UseTree, out: &mut Vec<UseLeaf>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(prefix, &p.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(leaf(prefix, &n.ident, None)),
        syn::UseTree::Rename(r) => out.push(leaf(prefix, &r.ident, Some(&r.rename))),
        syn::UseTree::Glob(g) => out.push(UseLeaf {
            path: prefix.clone(),
            name: None,
            line: g.span().start().line,
        }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(prefix, t, out);
            }
        }
    }
}

/// One imported path of a `use` item.
struct UseLeaf {
    path: Vec<String>,
    name: Option<String>,
    line: usize,
}

fn leaf(prefix: &[String], ident: &syn::Ident, rename: Option<&syn::Ident>) -> UseLeaf {
    let mut path = prefix.to_vec();
    // `use a::b::{self}` imports `a::b` under the name `b`.
    if ident != "self" {
        path.push(ident.to_string());
    }
    let name = rename
        .map(ToString::to_string)
        .or_else(|| path.last().cloned());
    UseLeaf {
        path,
        name,
        line: ident.span().start().line,
    }
}

/// Walks one file's items, recording modules, `use` names and paths.
struct Collector<'t> {
    tree: &'t mut Tree,
    /// The file, relative to the crate's directory, for reports.
    file: String,
    /// The module the visitor is in.
    module: ModPath,
    /// The directory that holds the current module's out-of-line children, and the
    /// directory `#[path]` is relative to.
    child_dir: PathBuf,
    path_dir: PathBuf,
    /// Blocks the visitor is in: a `use` inside a function does not name anything for
    /// the module.
    depth: usize,
    /// Out-of-line modules to read next: (module path, file).
    pending: Vec<(ModPath, PathBuf)>,
}

impl Collector<'_> {
    fn record(&mut self, path: Vec<String>, line: usize) {
        self.tree.refs.push(Ref {
            module: self.module.clone(),
            path,
            file: self.file.clone(),
            line,
            reexport: false,
        });
    }

    /// Records every `crate::`, `super::` or `self::` path in a macro call's tokens.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.scan_tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(id)
                    if (id == "crate" || id == "super" || id == "self")
                        && path_sep(&trees, i + 1) =>
                {
                    // A path of `::`-separated identifiers from here.
                    let line = id.span().start().line;
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    while path_sep(&trees, j) {
                        match trees.get(j + 2) {
                            Some(TokenTree::Ident(next)) => {
                                path.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    self.record(path, line);
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

/// Whether `trees[at..]` starts with `::`.
fn path_sep(trees: &[TokenTree], at: usize) -> bool {
    matches!(
        (trees.get(at), trees.get(at + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
    )
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::ForeignMod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::TraitAlias(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    // Test-only methods (`#[cfg(test)] fn ...` in an impl block); other impl items under
    // `cfg(test)` do not occur.
    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let name = m.ident.to_string();
        self.tree
            .modules
            .entry(self.module.clone())
            .or_default()
            .children
            .insert(name.clone());
        let mut child = self.module.clone();
        child.push(name.clone());
        match &m.content {
            Some((_, items)) => {
                self.tree.modules.entry(child.clone()).or_default();
                let outer = (
                    self.module.clone(),
                    self.child_dir.clone(),
                    self.path_dir.clone(),
                );
                self.module = child;
                self.child_dir = self.child_dir.join(&name);
                self.path_dir = self.child_dir.clone();
                for item in items {
                    self.visit_item(item);
                }
                (self.module, self.child_dir, self.path_dir) = outer;
            }
            None => {
                let file = match path_attr(&m.attrs) {
                    Some(p) => self.path_dir.join(p),
                    None => {
                        let flat = self.child_dir.join(format!("{name}.rs"));
                        if flat.exists() {
                            flat
                        } else {
                            self.child_dir.join(&name).join("mod.rs")
                        }
                    }
                };
                self.pending.push((child, file));
            }
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_some() {
            return; // `use ::name`: another crate
        }
        let mut leaves = Vec::new();
        flatten(&mut Vec::new(), &u.tree, &mut leaves);
        for leaf in leaves {
            if self.depth == 0
                && let Some(name) = &leaf.name
            {
                self.tree
                    .modules
                    .entry(self.module.clone())
                    .or_default()
                    .uses
                    .insert(name.clone(), leaf.path.clone());
            }
            self.record(leaf.path, leaf.line);
            if let Some(r) = self.tree.refs.last_mut() {
                r.reexport = !matches!(u.vis, syn::Visibility::Inherited);
            }
        }
    }

    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.depth += 1;
        syn::visit::visit_block(self, b);
        self.depth -= 1;
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none()
            && let Some(first) = p.segments.first()
            && (first.ident == "crate" || first.ident == "super" || first.ident == "self")
            && p.segments.len() > 1
        {
            let path = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.record(path, first.ident.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.scan_tokens(m.tokens.clone());
    }

    // `pub(crate)`, `pub(in crate::x)`: visibility, not an import.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    // Attributes hold doc text and lint names, not imports.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// Reads the crate whose root is `src/lib.rs` under `crate_dir`.
fn read_tree(crate_dir: &Path) -> Tree {
    let mut tree = Tree::default();
    tree.modules.insert(Vec::new(), Module::default());
    let mut pending = vec![(Vec::new(), crate_dir.join("src/lib.rs"))];
    while let Some((module, file)) = pending.pop() {
        let rel = file
            .strip_prefix(crate_dir)
            .unwrap_or(&file)
            .display()
            .to_string();
        let parsed = std::fs::read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|text| syn::parse_file(&text).map_err(|e| e.to_string()));
        let parsed = match parsed {
            Ok(p) => p,
            Err(e) => {
                tree.errors
                    .push(format!("{rel} (module {}): {e}", name(&module)));
                continue;
            }
        };
        tree.modules.entry(module.clone()).or_default();
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        // lib.rs and mod.rs hold their children beside them; `a.rs` holds them in `a/`.
        let child_dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("lib.rs" | "mod.rs") => dir.clone(),
            _ => dir.join(file.file_stem().unwrap_or_default()),
        };
        let mut c = Collector {
            tree: &mut tree,
            file: rel,
            module,
            child_dir,
            path_dir: dir,
            depth: 0,
            pending: Vec::new(),
        };
        for item in &parsed.items {
            c.visit_item(item);
        }
        pending.extend(c.pending);
    }
    tree
}

/// `crate::a::b`, or `crate`.
fn name(module: &[String]) -> String {
    std::iter::once("crate")
        .chain(module.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

// ---------------------------------------------------------------------------------------
// Resolving paths to modules.

impl Tree {
    /// The module `path`, written in `module`, names (or names an item of), following
    /// `use` re-exports; `None` for another crate's path.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Option<ModPath> {
        if depth > 16 {
            return None; // a `use` loop: not ours to judge
        }
        let (first, rest) = path.split_first()?;
        match first.as_str() {
            "crate" => self.walk(Vec::new(), rest, depth),
            "self" => self.walk(module.to_vec(), rest, depth),
            "super" => {
                let mut base = module.to_vec();
                base.pop()?;
                let mut rest = rest;
                while let [s, more @ ..] = rest
                    && s == "super"
                {
                    base.pop()?;
                    rest = more;
                }
                self.walk(base, rest, depth)
            }
            _ => {
                let m = self.modules.get(module)?;
                if m.children.contains(first) {
                    let mut child = module.to_vec();
                    child.push(first.clone());
                    self.walk(child, rest, depth)
                } else if let Some(target) = m.uses.get(first) {
                    if target.as_slice() == std::slice::from_ref(first) {
                        return None; // `use name;` of another crate
                    }
                    let target = self.resolve(module, target, depth + 1)?;
                    self.walk(target, rest, depth)
                } else {
                    None // another crate's path, or a local item
                }
            }
        }
    }

    /// Walks `rest` down from module `at` through child modules and re-exports, to the
    /// deepest module it reaches.
    fn walk(&self, mut at: ModPath, rest: &[String], depth: usize) -> Option<ModPath> {
        for (i, seg) in rest.iter().enumerate() {
            let m = self.modules.get(&at)?;
            if m.children.contains(seg) {
                at.push(seg.clone());
            } else if let Some(target) = m.uses.get(seg) {
                let target = self.resolve(&at, target, depth + 1)?;
                return self.walk(target, &rest[i + 1..], depth + 1);
            } else {
                break; // an item of `at`
            }
        }
        Some(at)
    }
}

// ---------------------------------------------------------------------------------------
// The rules.

/// The unit a module belongs to: its top-level module, or `transport::x`.
fn unit(module: &[String]) -> String {
    match module {
        [] => "crate".to_string(),
        [t, sub, ..] if t == "transport" => format!("transport::{sub}"),
        [top, ..] => top.clone(),
    }
}

/// The layer of a unit: its longest prefix in `layers`.
fn layer(layers: &[(&str, u8)], unit: &str) -> Option<u8> {
    layers
        .iter()
        .filter(|(prefix, _)| {
            unit == *prefix
                || unit
                    .strip_prefix(prefix)
                    .is_some_and(|r| r.starts_with("::"))
        })
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(_, l)| l)
}

/// One import from one unit into another, where it stands.
#[derive(Clone, Debug)]
struct Edge {
    from: String,
    to: String,
    /// `file:line: crate::a::b → crate::c::d`
    site: String,
}

/// What the rules find: violations keyed as [`Known`] entries are, each with its sites.
#[derive(Debug, Default)]
struct Findings {
    /// (rule, from, to) → sites.
    edges: BTreeMap<(String, String, String), Vec<String>>,
    /// Each circle's sorted units → the lines that describe it.
    circles: BTreeMap<Vec<String>, Vec<String>>,
    /// Problems with the check itself (unreadable files, modules with no layer).
    errors: Vec<String>,
}

fn find(tree: &Tree, layers: &[(&str, u8)], backends: &[&str]) -> Findings {
    let mut f = Findings {
        errors: tree.errors.clone(),
        ..Findings::default()
    };
    let mut edges = Vec::new();
    let mut seen = BTreeSet::new();
    for r in &tree.refs {
        let Some(target) = tree.resolve(&r.module, &r.path, 0) else {
            continue;
        };
        if r.reexport && target.starts_with(&r.module) {
            continue;
        }
        let (from, to) = (unit(&r.module), unit(&target));
        // One site per line: `use a::{B, C}` is one import of `a`.
        if from != to && seen.insert((r.file.clone(), r.line, from.clone(), to.clone())) {
            edges.push(Edge {
                site: format!(
                    "{}:{}: {} → {}",
                    r.file,
                    r.line,
                    name(&r.module),
                    name(&target)
                ),
                from,
                to,
            });
        }
    }
    let units: BTreeSet<String> = tree.modules.keys().map(|m| unit(m)).collect();
    for u in &units {
        if layer(layers, u).is_none() {
            f.errors.push(format!(
                "module crate::{u} has no layer: add it to LAYERS in engine/tests/layers.rs"
            ));
        }
    }
    for e in &edges {
        let (Some(lf), Some(lt)) = (layer(layers, &e.from), layer(layers, &e.to)) else {
            continue;
        };
        let rule = if backends.contains(&e.from.as_str()) && backends.contains(&e.to.as_str()) {
            "backend"
        } else if lt > lf {
            "layer"
        } else {
            continue;
        };
        f.edges
            .entry((rule.to_string(), e.from.clone(), e.to.clone()))
            .or_default()
            .push(e.site.clone());
    }
    // Circles: the strongly connected components of the unit graph with more than one unit.
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in &edges {
        next.entry(&e.from).or_default().insert(&e.to);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([from]);
        while let Some(u) = queue.pop_front() {
            for &v in next.get(u).into_iter().flatten() {
                if seen.insert(v) {
                    queue.push_back(v);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> =
        units.iter().map(|u| (u.as_str(), reach(u))).collect();
    let mut placed = BTreeSet::new();
    for u in &units {
        if placed.contains(u.as_str()) {
            continue;
        }
        let scc: Vec<String> = units
            .iter()
            .filter(|v| {
                v == &u
                    || (reaches[u.as_str()].contains(v.as_str())
                        && reaches[v.as_str()].contains(u.as_str()))
            })
            .cloned()
            .collect();
        placed.extend(scc.iter().cloned());
        if scc.len() > 1 {
            f.circles
                .insert(scc.clone(), describe(&scc, &edges, &next, layers));
        }
    }
    f
}

/// Describes one circle: each import in it that does not go down a layer (the imports to
/// cut), with its sites and the shortest way back that closes the circle, then a count of
/// the imports that go down.
fn describe(
    scc: &[String],
    edges: &[Edge],
    next: &BTreeMap<&str, BTreeSet<&str>>,
    layers: &[(&str, u8)],
) -> Vec<String> {
    let mut pairs: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for e in edges {
        if scc.contains(&e.from) && scc.contains(&e.to) {
            pairs.entry((&e.from, &e.to)).or_default().push(&e.site);
        }
    }
    let mut lines = Vec::new();
    let mut down = Vec::new();
    for ((from, to), sites) in &pairs {
        let (lf, lt) = (layer(layers, from), layer(layers, to));
        if lt < lf {
            down.push(format!("{from} → {to} ({})", sites.len()));
            continue;
        }
        let how = if lt == lf { "within its layer" } else { "up" };
        lines.push(format!(
            "{from} → {to} ({how}), closed by {}; {} site(s):",
            shortest(next, scc, to, from)
                .map(|back| format!("{from} → {}", back.join(" → ")))
                .unwrap_or_default(),
            sites.len()
        ));
        lines.extend(sites.iter().map(|s| format!("    {s}")));
    }
    lines.push(format!("imports down a layer in it: {}", down.join(", ")));
    lines
}

/// The shortest chain of imports from `from` to `to` inside `scc`, both ends included.
fn shortest(
    next: &BTreeMap<&str, BTreeSet<&str>>,
    scc: &[String],
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(u) = queue.pop_front() {
        if u == to {
            let mut path = vec![to.to_string()];
            let mut at = to;
            while at != from {
                at = parent[at];
                path.push(at.to_string());
            }
            path.reverse();
            return Some(path);
        }
        for &v in next.get(u).into_iter().flatten() {
            if v != from && scc.iter().any(|s| s == v) && !parent.contains_key(v) {
                parent.insert(v, u);
                queue.push_back(v);
            }
        }
    }
    None
}

/// The test's verdict: what is new, what is stale, and the full picture either way.
fn verdict(f: &Findings, known: &[Known]) -> (String, bool) {
    let mut report = String::new();
    let mut ok = f.errors.is_empty();
    for e in &f.errors {
        let _ = writeln!(report, "ERROR {e}");
    }
    let key = |k: &Known| match k {
        Known::Layer(a, b) => ("layer".to_string(), a.to_string(), b.to_string()),
        Known::Backend(a, b) => ("backend".to_string(), a.to_string(), b.to_string()),
        Known::Circle(units) => ("circle".to_string(), units.join(" "), String::new()),
    };
    let known: BTreeSet<_> = known.iter().map(key).collect();
    let mut found = BTreeSet::new();
    // Whether a violation is listed; an unlisted one fails the test.
    let mut status = |k: (String, String, String)| {
        let listed = known.contains(&k);
        found.insert(k);
        ok &= listed;
        if listed { "known" } else { "NEW" }
    };
    for ((rule, from, to), sites) in &f.edges {
        let status = status((rule.clone(), from.clone(), to.clone()));
        let why = if rule == "backend" {
            "a backend imports another backend's insides".to_string()
        } else {
            format!("{from} is below {to}")
        };
        let _ = writeln!(
            report,
            "{status} {rule}: {from} → {to} ({why}), {} site(s):",
            sites.len()
        );
        for s in sites {
            let _ = writeln!(report, "    {s}");
        }
    }
    for (units, lines) in &f.circles {
        let status = status(("circle".to_string(), units.join(" "), String::new()));
        let _ = writeln!(report, "{status} circle: {}", units.join(", "));
        for line in lines {
            let _ = writeln!(report, "    {line}");
        }
    }
    for k in known.difference(&found) {
        ok = false;
        let _ = writeln!(
            report,
            "STALE {} {} {}: no longer occurs; remove it from KNOWN",
            k.0, k.1, k.2
        );
    }
    if !ok {
        let _ = writeln!(report, "\nKNOWN as the tree is now:");
        for (rule, from, to) in &found {
            let _ = match rule.as_str() {
                "layer" => writeln!(report, "    Known::Layer({from:?}, {to:?}),"),
                "backend" => writeln!(report, "    Known::Backend({from:?}, {to:?}),"),
                _ => writeln!(
                    report,
                    "    Known::Circle(&[{}]),",
                    from.split(' ')
                        .map(|u| format!("{u:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
        }
    }
    (report, ok)
}

#[test]
fn the_engine_keeps_its_layers() {
    let tree = read_tree(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert!(
        tree.modules.len() > 20,
        "read only {} modules of engine/src",
        tree.modules.len()
    );
    let findings = find(&tree, LAYERS, BACKENDS);
    let (report, ok) = verdict(&findings, KNOWN);
    println!("{report}");
    assert!(ok, "engine/src breaks its layers:\n{report}");
}

/// The check itself, on a small crate written here: it finds each kind of violation where
/// it stands (through a macro's tokens, a re-export, `super::super`), ignores comments,
/// strings, doc links and test code, and fails on a new or a stale entry.
#[test]
fn the_check_finds_each_violation_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "src/lib.rs",
        "//! [`crate::top::Api`] is a doc link, not an import.\n\
         mod low;\nmod native;\nmod ring;\nmod top;\npub use top::Api;\npub fn root() {}\n",
    );
    write(
        "src/low.rs",
        "// use crate::top::Api;\n\
         /// See [`crate::top::NAME`].\n\
         pub fn f() -> &'static str { \"crate::top::Api\" }\n\
         pub fn g() -> String { format!(\"{}\", crate::top::NAME) }\n\
         #[cfg(test)]\nmod tests { use crate::top::Api; }\n\
         #[cfg(all(unix, test))]\nuse crate::native::X;\n",
    );
    write(
        "src/top.rs",
        "use crate::low::f;\npub struct Api;\npub const NAME: &str = \"top\";\n\
         pub fn g() { crate::root() }\n",
    );
    write("src/ring/mod.rs", "pub(crate) mod inner;\n");
    write(
        "src/ring/inner.rs",
        "pub fn part() {}\npub fn h() { let _ = super::super::top::NAME; }\n",
    );
    write(
        "src/native.rs",
        "pub struct X;\nuse crate::ring::inner::part;\nuse crate::Api;\nuse super::low;\n",
    );
    let tree = read_tree(dir.path());
    assert!(tree.errors.is_empty(), "{:?}", tree.errors);
    let layers = [
        ("low", 0),
        ("ring", 3),
        ("native", 3),
        ("top", 5),
        ("crate", 5),
    ];
    let f = find(&tree, &layers, &["ring", "native"]);
    let found: Vec<_> = f
        .edges
        .iter()
        .map(|((rule, from, to), sites)| format!("{rule} {from} {to} {sites:?}"))
        .collect();
    assert_eq!(
        found,
        [
            "backend native ring [\"src/native.rs:2: crate::native → crate::ring::inner\"]",
            "layer low top [\"src/low.rs:4: crate::low → crate::top\"]",
            "layer native top [\"src/native.rs:3: crate::native → crate::top\"]",
            "layer ring top [\"src/ring/inner.rs:2: crate::ring::inner → crate::top\"]",
        ]
    );
    assert_eq!(
        f.circles.keys().collect::<Vec<_>>(),
        [&vec!["low".to_string(), "top".to_string()]]
    );
    let all = [
        Known::Backend("native", "ring"),
        Known::Layer("low", "top"),
        Known::Layer("native", "top"),
        Known::Layer("ring", "top"),
        Known::Circle(&["low", "top"]),
    ];
    assert!(verdict(&f, &all).1);
    let (report, ok) = verdict(&f, &all[1..]);
    assert!(
        !ok && report.contains("NEW backend: native → ring"),
        "{report}"
    );
    let mut stale = all.to_vec();
    stale.push(Known::Layer("top", "ring"));
    let (report, ok) = verdict(&f, &stale);
    assert!(!ok && report.contains("STALE layer top ring"), "{report}");
    // A module the table does not place is an error, not a pass.
    let f = find(&tree, &layers[1..], &["ring", "native"]);
    assert!(!verdict(&f, &all).1);
}
