//! A user's own bzImage, with the VFIO modules from its module tree when one is given.
use std::{fs, path::Path};

use anyhow::{Context as _, Result, bail};

use super::{Kernel, extract_modules, fresh_dir, load};

pub fn prepare(image: &Path, modules: Option<&Path>, cache: &Path) -> Result<Kernel> {
    let label = format!("user kernel {}", image.display());
    let Some(modules) = modules else {
        eprintln!("xtask: no --modules given: the guest loads no modules (VFIO must be built in)");
        return Ok(Kernel {
            label,
            image: image.to_path_buf(),
            modules: Vec::new(),
        });
    };
    let dest = cache.join("build/user-kernel-modules");
    fresh_dir(&dest)?;
    // Accept an INSTALL_MOD_PATH root or a lib/modules/<kver> directory.
    let tree = if modules.join("lib/modules").is_dir() || modules.join("usr/lib/modules").is_dir() {
        modules.to_path_buf()
    } else if modules.join("kernel").is_dir() {
        let link = cache.join("build/user-kernel-tree");
        fresh_dir(&link.join("lib/modules"))?;
        let kver = modules.file_name().context("--modules has no file name")?;
        std::os::unix::fs::symlink(fs::canonicalize(modules)?, link.join("lib/modules").join(kver))?;
        link
    } else {
        bail!(
            "--modules {}: expected a dir holding lib/modules/<kver> or a lib/modules/<kver> dir",
            modules.display()
        );
    };
    extract_modules(&tree, &dest)?;
    let mut k = load(&dest, label)?;
    k.image = image.to_path_buf();
    Ok(k)
}
