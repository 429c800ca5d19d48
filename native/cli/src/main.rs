//! The `hearth` command line.

fn main() -> anyhow::Result<()> {
    Ok(())
}
