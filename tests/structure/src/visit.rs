//! One file's imports of its own crate and its functions' lengths.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

use crate::{Function, Import, ModPath};

/// What each module re-exports with `pub use`: the name it exports and
/// the file module that name comes from. `"*"` stands for a glob.
pub type Reexports = BTreeMap<ModPath, BTreeMap<String, ModPath>>;

/// Reads `file`, the module at `module`, against the crate's `known` file
/// modules and what they re-export.
pub fn read(
    file: &syn::File,
    module: &ModPath,
    known: &BTreeSet<ModPath>,
    reexports: &Reexports,
) -> (Vec<Import>, Vec<Function>) {
    let mut v = Reader {
        known,
        reexports,
        current: module.clone(),
        imports: BTreeSet::new(),
        functions: Vec::new(),
        impl_of: Vec::new(),
    };
    v.visit_file(file);
    (v.imports.into_iter().collect(), v.functions)
}

/// The names `file` (the module at `module`) re-exports with a `pub use`
/// at its top level, and the file module each comes from.
pub fn reexports(
    file: &syn::File,
    module: &ModPath,
    known: &BTreeSet<ModPath>,
) -> BTreeMap<String, ModPath> {
    let empty = Reexports::new();
    let v = Reader {
        known,
        reexports: &empty,
        current: module.clone(),
        imports: BTreeSet::new(),
        functions: Vec::new(),
        impl_of: Vec::new(),
    };
    let mut out = BTreeMap::new();
    for item in &file.items {
        let syn::Item::Use(u) = item else { continue };
        if matches!(u.vis, syn::Visibility::Inherited) {
            continue;
        }
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        let mut names = Vec::new();
        exported_names(&u.tree, &mut names);
        for (path, name) in paths.iter().zip(names) {
            if let Some(target) = v.resolve(path) {
                out.insert(name, target);
            }
        }
    }
    out
}

/// The name each path of a `use` tree is exported under, in the order
/// [`use_paths`] gives the paths (`"*"` for a glob).
fn exported_names(tree: &syn::UseTree, out: &mut Vec<String>) {
    match tree {
        syn::UseTree::Path(p) => exported_names(&p.tree, out),
        syn::UseTree::Name(n) => out.push(n.ident.to_string()),
        syn::UseTree::Rename(r) => out.push(r.rename.to_string()),
        syn::UseTree::Glob(_) => out.push("*".to_owned()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|i| exported_names(i, out)),
    }
}

/// Re-exports followed at most this many times (a re-export of a
/// re-export), so that a circle of them cannot loop.
const MAX_HOPS: usize = 4;

struct Reader<'a> {
    known: &'a BTreeSet<ModPath>,
    reexports: &'a Reexports,
    /// The module the visitor is in: the file's, plus inline `mod x {}`s.
    current: ModPath,
    imports: BTreeSet<Import>,
    functions: Vec<Function>,
    /// The type of each `impl` block the visitor is in.
    impl_of: Vec<String>,
}

impl Reader<'_> {
    /// Records the path `segments`, written at `line`, if it names a file
    /// module of this crate.
    fn path(&mut self, segments: &[String], line: usize) {
        if let Some(target) = self.resolve(segments) {
            self.imports.insert(Import { target, line });
        }
    }

    /// The file module `segments` names, through the re-exports of the
    /// modules on its way; `None` when it is not a path into this crate.
    fn resolve(&self, segments: &[String]) -> Option<ModPath> {
        let first = segments.first()?;
        let absolute: ModPath = match first.as_str() {
            "crate" => segments[1..].to_vec(),
            "self" | "super" => {
                let mut base = self.current.clone();
                let mut rest = segments;
                while let Some((head, tail)) = rest.split_first() {
                    match head.as_str() {
                        "self" => {}
                        "super" => {
                            base.pop();
                        }
                        _ => break,
                    }
                    rest = tail;
                }
                base.extend(rest.iter().cloned());
                base
            }
            _ => {
                // A child module named without `self::` (2018 paths).
                let mut child = self.current.clone();
                child.push(first.clone());
                if !self.known.contains(&child) {
                    return None;
                }
                let mut all = self.current.clone();
                all.extend(segments.iter().cloned());
                all
            }
        };
        Some(self.deepest(absolute, 0))
    }

    /// The deepest file module `absolute` names; when the rest of the path
    /// is a name that module re-exports, the module it comes from.
    fn deepest(&self, absolute: ModPath, hops: usize) -> ModPath {
        let mut target = absolute.clone();
        while !target.is_empty() && !self.known.contains(&target) {
            target.pop();
        }
        let (Some(next), Some(exports)) = (absolute.get(target.len()), self.reexports.get(&target))
        else {
            return target;
        };
        let from = exports.get(next).or_else(|| {
            let mut globs = exports.iter().filter(|(k, _)| k.as_str() == "*");
            match (globs.next(), globs.next()) {
                (Some((_, only)), None) => Some(only),
                _ => None,
            }
        });
        match from {
            Some(module) if hops < MAX_HOPS && module != &target => {
                let mut rest = module.clone();
                rest.extend(absolute[target.len() + 1..].iter().cloned());
                self.deepest(rest, hops + 1)
            }
            _ => target,
        }
    }

    /// Records a function's length from its first doc comment or
    /// attribute to its closing brace: the doc is part of what a reader
    /// holds.
    fn function(
        &mut self,
        attrs: &[syn::Attribute],
        name: &syn::Ident,
        sig: &syn::Signature,
        block: &syn::Block,
    ) {
        let start = attrs
            .iter()
            .map(|a| a.pound_token.span.start().line)
            .chain([sig.fn_token.span.start().line])
            .min()
            .unwrap_or(0);
        let end = block.brace_token.span.close().end().line;
        let name = match self.impl_of.last() {
            Some(ty) => format!("{ty}::{name}"),
            None => name.to_string(),
        };
        self.functions.push(Function {
            name,
            line: start,
            lines: end.saturating_sub(start) + 1,
        });
    }

    /// Paths inside a macro's tokens (`json!({ crate::a::B: 1 })`), which
    /// syn does not parse.
    fn tokens(&mut self, tokens: TokenStream) {
        let flat = flatten(tokens);
        let mut i = 0;
        while i < flat.len() {
            let starts = matches!(&flat[i], TokenTree::Ident(id) if id == "crate" || id == "super");
            if !starts {
                i += 1;
                continue;
            }
            let line = flat[i].span().start().line;
            let mut segments = vec![flat[i].to_string()];
            let mut j = i + 1;
            while let (
                Some(TokenTree::Punct(a)),
                Some(TokenTree::Punct(b)),
                Some(TokenTree::Ident(id)),
            ) = (flat.get(j), flat.get(j + 1), flat.get(j + 2))
            {
                if a.as_char() != ':' || b.as_char() != ':' {
                    break;
                }
                segments.push(id.to_string());
                j += 3;
            }
            self.path(&segments, line);
            i = j.max(i + 1);
        }
    }
}

fn flatten(tokens: TokenStream) -> Vec<TokenTree> {
    let mut out = Vec::new();
    for t in tokens {
        match t {
            TokenTree::Group(g) => out.extend(flatten(g.stream())),
            other => out.push(other),
        }
    }
    out
}

/// Every path a `use` tree names (a glob or `self` ends at its parent).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => out.push(prefix.clone()),
        syn::UseTree::Name(n) => {
            let mut p = prefix.clone();
            p.push(n.ident.to_string());
            out.push(p);
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            p.push(r.ident.to_string());
            out.push(p);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                use_paths(item, prefix, out);
            }
        }
    }
}

fn first_line(tree: &syn::UseTree) -> usize {
    match tree {
        syn::UseTree::Path(p) => p.ident.span().start().line,
        syn::UseTree::Name(n) => n.ident.span().start().line,
        syn::UseTree::Rename(r) => r.ident.span().start().line,
        syn::UseTree::Glob(g) => g.star_token.span.start().line,
        syn::UseTree::Group(g) => g.brace_token.span.open().start().line,
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let line = first_line(&item.tree);
        let mut paths = Vec::new();
        use_paths(&item.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            self.path(&p, line);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map(|s| s.ident.span().start().line)
            .unwrap_or(0);
        if segments.len() > 1 || matches!(segments.first().map(String::as_str), Some("crate")) {
            self.path(&segments, line);
        }
        syn::visit::visit_path(self, path);
    }

    /// `pub(crate)` and `pub(in crate::a)` say who may see an item, not
    /// what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_none() {
            // `mod x;` declares a file module; it imports nothing.
            return;
        }
        self.current.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.current.pop();
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        let ty = match item.self_ty.as_ref() {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map(|s| s.ident.to_string())
                .unwrap_or_default(),
            _ => "impl".to_owned(),
        };
        self.impl_of.push(ty);
        syn::visit::visit_item_impl(self, item);
        self.impl_of.pop();
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        self.function(&item.attrs, &item.sig.ident, &item.sig, &item.block);
        // A nested function is named by itself, not by an enclosing impl.
        let outer = std::mem::take(&mut self.impl_of);
        syn::visit::visit_item_fn(self, item);
        self.impl_of = outer;
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        self.function(&item.attrs, &item.sig.ident, &item.sig, &item.block);
        syn::visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(block) = &item.default {
            self.function(&item.attrs, &item.sig.ident, &item.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}
