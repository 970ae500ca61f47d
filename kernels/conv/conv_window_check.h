#pragma once
// The shape checks that plain and grouped convolutions share, in one place so that both ops
// refuse the same shapes with the same words.

namespace cnn {

// A convolution's sizes as the checks see them (dilation 1 for the plain conv2d).
struct ConvWindow {
  int n, c, h, w, oc, kh, kw;
  int stride_h, stride_w, pad_h, pad_w;
  int dil_h = 1, dil_w = 1;
};

// Every size, stride and dilation positive, padding >= 0, the (dilated) kernel inside the padded
// input, and the padded extent within int (oh()/ow() are computed in int). Throws cnn::Error
// "conv2d: ..." naming the field and its value.
void check_conv_window(const ConvWindow& s);

}  // namespace cnn
