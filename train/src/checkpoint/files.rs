//! A checkpoint's safetensors files: tensors (f32 or f64, on the CPU) to their bytes and back,
//! a file read with its metadata, and files written atomically (a temporary file renamed into
//! place).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype, SafeTensors, View};

use crate::error::{Result, TrainError};

/// A tensor's bytes, ready for safetensors.
struct RawTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for RawTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// The error of the tensor `name` (of the file `path`) of the dtype `actual`, neither F32 nor F64.
fn not_f32_or_f64(path: &Path, name: &str, actual: String) -> TrainError {
    TrainError::TensorDType {
        path: path.to_path_buf(),
        name: name.to_string(),
        actual,
        expected: "F32 or F64".to_string(),
    }
}

/// The little-endian bytes of an F32 or F64 tensor.
fn raw(path: &Path, name: &str, tensor: &Tensor) -> Result<RawTensor> {
    let flat = tensor
        .flatten_all()
        .map_err(TrainError::tensor(format!("flattening {name}")))?;
    let context = || TrainError::tensor(format!("reading {name}"));
    let (dtype, data) = match tensor.dtype() {
        DType::F32 => {
            let values = flat.to_vec1::<f32>().map_err(context())?;
            (
                Dtype::F32,
                values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        }
        DType::F64 => {
            let values = flat.to_vec1::<f64>().map_err(context())?;
            (
                Dtype::F64,
                values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        }
        other => return Err(not_f32_or_f64(path, name, format!("{other:?}"))),
    };
    let shape = tensor.dims().to_vec();
    Ok(RawTensor { dtype, shape, data })
}

/// `tensors` as a safetensors file with metadata `info`.
pub(super) fn serialize(
    path: &Path,
    tensors: &BTreeMap<String, Tensor>,
    info: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let raws = tensors
        .iter()
        .map(|(name, t)| Ok((name.clone(), raw(path, name, t)?)))
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(raws, Some(info)).map_err(|e| TrainError::Safetensors {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The tensors (on the CPU) and metadata of the safetensors file `path`.
pub(super) fn read_safetensors(
    path: &Path,
) -> Result<(BTreeMap<String, Tensor>, HashMap<String, String>)> {
    let bytes = fs::read(path).map_err(TrainError::io(path, "read"))?;
    let bad_file = |e: safetensors::SafeTensorError| TrainError::Safetensors {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(bad_file)?;
    let info = header.metadata().clone().unwrap_or_default();
    let file = SafeTensors::deserialize(&bytes).map_err(bad_file)?;
    let tensors = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let tensor = tensor_of(path, &name, view.dtype(), view.shape(), view.data())?;
            Ok((name, tensor))
        })
        .collect::<Result<BTreeMap<_, _>>>()?;
    Ok((tensors, info))
}

/// A CPU tensor from little-endian F32 or F64 bytes.
fn tensor_of(
    path: &Path,
    name: &str,
    dtype: Dtype,
    shape: &[usize],
    data: &[u8],
) -> Result<Tensor> {
    let built = match dtype {
        Dtype::F32 => {
            let values: Vec<f32> = data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu)
        }
        Dtype::F64 => {
            let values: Vec<f64> = data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu)
        }
        other => return Err(not_f32_or_f64(path, name, format!("{other}"))),
    };
    built.map_err(TrainError::tensor(format!(
        "building {name} from {}",
        path.display()
    )))
}

/// Writes `bytes` to a temporary file beside `path`, flushes it to disk and renames it to
/// `path`, so that `path` is never seen half-written.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let temporary = with_suffix(path, &format!(".tmp-{}", std::process::id()));
    let written = (|| {
        let mut file =
            fs::File::create(&temporary).map_err(TrainError::io(&temporary, "create"))?;
        file.write_all(bytes)
            .map_err(TrainError::io(&temporary, "write"))?;
        file.sync_all()
            .map_err(TrainError::io(&temporary, "flush to disk"))
    })();
    let renamed = written.and_then(|()| {
        fs::rename(&temporary, path)
            .map_err(TrainError::io(path, "rename the temporary file into place"))
    });
    if renamed.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    renamed
}

/// `path` with `suffix` appended to its file name (`FILE` -> `FILE.config.json`).
pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tests::scratch_dir;

    #[test]
    fn tensors_and_metadata_round_trip_bit_for_bit() {
        let path = scratch_dir("ckpt-files").join("t.safetensors");
        let values = [1.5f64, -0.0, f64::MIN_POSITIVE, 3.25];
        let f64s = Tensor::from_slice(&values, (2, 2), &Device::Cpu).unwrap();
        let f32s = Tensor::from_slice(&[0.5f32, 7.0], 2, &Device::Cpu).unwrap();
        let map = BTreeMap::from([("a".to_string(), f64s), ("b".to_string(), f32s)]);
        let info = HashMap::from([("k".to_string(), "v".to_string())]);
        write_atomically(&path, &serialize(&path, &map, info.clone()).unwrap()).unwrap();
        let (read, read_info) = read_safetensors(&path).unwrap();
        assert_eq!(read_info, info);
        let a = read["a"].flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let bits = |xs: &[f64]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&values));
        assert_eq!(read["b"].dtype(), DType::F32);
        let folder = path.parent().unwrap();
        let names: Vec<_> = fs::read_dir(folder)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["t.safetensors"]);
    }

    #[test]
    fn other_dtypes_are_refused_by_name() {
        let path = Path::new("x.safetensors");
        let ids = Tensor::from_slice(&[1u32, 2], 2, &Device::Cpu).unwrap();
        let map = BTreeMap::from([("ids".to_string(), ids)]);
        let error = serialize(path, &map, HashMap::new()).unwrap_err();
        assert!(error.to_string().contains("ids"), "{error}");
    }
}
