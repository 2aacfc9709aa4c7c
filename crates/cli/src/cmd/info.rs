//! `synapse info MODEL.gguf`: the header, the metadata and a table of tensors; with `--kernels`,
//! the kernels each weight matrix runs on this CPU.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value as Json};
use synapse_gguf::{Array, GgufFile, Value};

use super::common::printable;

pub fn run(path: &Path, as_json: bool, full_arrays: bool, kernels: bool) -> Result<()> {
    let file = super::common::open(path)?;
    let mut out = io::BufWriter::new(io::stdout().lock());
    if kernels {
        print_kernels(&mut out, &file)?;
    } else if as_json {
        serde_json::to_writer_pretty(&mut out, &to_json(&file, full_arrays))?;
        writeln!(out)?;
    } else {
        print_text(&mut out, &file)?;
    }
    out.flush()?;
    Ok(())
}

/// Long strings (chat templates) are cut in the text listing; `--json` has them whole.
fn short(v: &Value) -> String {
    const MAX: usize = 100;
    match v {
        Value::String(s) if s.len() > MAX => {
            let cut = s
                .char_indices()
                .take_while(|(i, _)| *i < MAX)
                .last()
                .map_or(0, |(i, c)| i + c.len_utf8());
            format!("{:?}... ({} bytes)", &s[..cut], s.len())
        }
        _ => v.to_string(),
    }
}

fn print_text(out: &mut impl Write, file: &GgufFile) -> io::Result<()> {
    let h = file.header();
    let md = file.metadata();
    writeln!(
        out,
        "file:        {}",
        printable(
            &file
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        )
    )?;
    writeln!(
        out,
        "size:        {} bytes ({})",
        file.file_len(),
        human_bytes(file.file_len())
    )?;
    writeln!(
        out,
        "gguf:        version {}, alignment {}, data at byte {}",
        h.version, h.alignment, h.data_start
    )?;
    if let Ok(arch) = md.str("general.architecture") {
        writeln!(out, "architecture: {}", printable(arch))?;
    }
    if let Ok(name) = md.str("general.name") {
        writeln!(out, "name:        {}", printable(name))?;
    }

    writeln!(out, "\nmetadata ({} keys):", md.len())?;
    let width = md.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in md.iter() {
        writeln!(
            out,
            "  {:<width$}  {:<6}  {}",
            printable(k),
            v.value_type().name(),
            printable(&short(v))
        )?;
    }

    let tensors = file.tensor_infos();
    writeln!(out, "\ntensors ({}):", tensors.len())?;
    let name_w = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "  {:<name_w$}  {:<7}  {:<22}  {:>12}  {:>12}",
        "name", "type", "shape", "bytes", "offset"
    )?;
    for t in tensors {
        let shape = t
            .shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" x ");
        writeln!(
            out,
            "  {:<name_w$}  {:<7}  {:<22}  {:>12}  {:>12}",
            printable(&t.name),
            t.ggml_type.name(),
            shape,
            t.size,
            h.data_start + t.offset
        )?;
    }

    // Totals per type: what the file is made of.
    let mut by_type: BTreeMap<_, (u64, u64, u64)> = BTreeMap::new();
    for t in tensors {
        let e = by_type.entry(t.ggml_type).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
        e.2 += t.size;
    }
    let total: u64 = tensors.iter().map(|t| t.n_elements()).sum();
    writeln!(out, "\nby type:")?;
    for (ty, (n, elems, bytes)) in by_type {
        let bpw = if elems > 0 {
            bytes as f64 * 8.0 / elems as f64
        } else {
            0.0
        };
        writeln!(
            out,
            "  {:<7} {n:>4} tensors  {elems:>12} weights  {:>10}  {bpw:.2} bits/weight",
            ty.name(),
            human_bytes(bytes)
        )?;
    }
    writeln!(out, "  total        {total:>12} weights")?;
    Ok(())
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn to_json(file: &GgufFile, full_arrays: bool) -> Json {
    let h = file.header();
    let metadata: serde_json::Map<String, Json> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), value_json(v, full_arrays)))
        .collect();
    let tensors: Vec<Json> = file
        .tensor_infos()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ggml_type.name(),
                "shape": t.shape,
                "bytes": t.size,
                "offset": h.data_start + t.offset,
            })
        })
        .collect();
    json!({
        "path": file.path().map(|p| p.display().to_string()),
        "file_size": file.file_len(),
        "version": h.version,
        "alignment": h.alignment,
        "data_offset": h.data_start,
        "architecture": file.metadata().str("general.architecture").ok(),
        "metadata": metadata,
        "tensors": tensors,
    })
}

fn value_json(v: &Value, full_arrays: bool) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(a) if full_arrays => array_json(a),
        Value::Array(a) => {
            json!({ "type": "array", "elem_type": a.elem_type().name(), "len": a.len() })
        }
    }
}

fn array_json(a: &Array) -> Json {
    match a {
        Array::U8(v) => json!(v),
        Array::I8(v) => json!(v),
        Array::U16(v) => json!(v),
        Array::I16(v) => json!(v),
        Array::U32(v) => json!(v),
        Array::I32(v) => json!(v),
        Array::F32(v) => json!(v),
        Array::Bool(v) => json!(v),
        Array::String(v) => json!(v),
        Array::U64(v) => json!(v),
        Array::I64(v) => json!(v),
        Array::F64(v) => json!(v),
        Array::Array(v) => Json::Array(v.iter().map(array_json).collect()),
    }
}

/// For each weight matrix (each tensor of two or more dimensions in a format with a dot
/// product), the kernels one token's product and a batch's run on this CPU, with why: what
/// `synapse_quant::kernels::plan` decides when the engine loads it. The kernel configuration
/// (`SYNAPSE_ISA`, `SYNAPSE_PACK`) applies, as it does to `run`. A fused tensor (Phi-3's
/// `attn_qkv`) is listed whole; the engine packs each of its parts on its own.
fn print_kernels(out: &mut impl Write, file: &GgufFile) -> io::Result<()> {
    use synapse_quant::kernels::plan;
    let cpu = synapse_quant::cpu();
    let packing = !synapse_quant::config().no_pack;
    writeln!(
        out,
        "kernels on this CPU: {} (tier cap: {}; packing {})",
        cpu.tier_name(),
        synapse_quant::config().isa_cap.map_or("none", |t| t.name()),
        if packing { "on" } else { "off: SYNAPSE_PACK=0" }
    )?;
    let tied = file.tensors().all(|t| t.info.name != "output.weight");
    let width = file.tensors().map(|t| t.info.name.len()).max().unwrap_or(0);
    for t in file.tensors() {
        let info = t.info;
        let ty = info.ggml_type;
        if info.shape.len() < 2 || synapse_quant::vec_dot_type(ty).is_err() {
            continue;
        }
        let name = printable(&info.name);
        let (cols, rows) = (info.shape[0], info.shape[1] as usize);
        let experts: u64 = info.shape[2..].iter().product();
        let shape = if experts > 1 {
            format!("{experts} x {rows} x {cols}")
        } else {
            format!("{rows} x {cols}")
        };
        write!(out, "{name:<width$}  {ty:<6}  {shape}")?;
        // The token embedding is read by row lookups; a tied one is the output matrix too,
        // packed as any other.
        if info.name == "token_embd.weight" && !tied {
            writeln!(out, "  (row lookups only)")?;
            continue;
        }
        let p = plan(cpu, ty, rows, packing);
        let list = |ks: Vec<(&synapse_quant::kernels::Kernel, usize, &str)>| {
            let parts: Vec<String> = ks
                .iter()
                .map(|(k, n, why)| {
                    let of = if ks.len() > 1 {
                        format!(" ({n} rows)")
                    } else {
                        String::new()
                    };
                    format!("{}{of}: {why}", k.name())
                })
                .collect();
            parts.join("; ")
        };
        writeln!(out, "\n    one token: {}", list(p.decode(rows)))?;
        writeln!(out, "    batch:     {}", list(p.batch(rows)))?;
    }
    Ok(())
}
